#!/usr/bin/env bash
# The whole placement table: every trace in data/openb/ x every policy x seeds 42-51, with the
# offline references beside them, at 100 % and 130 % arrived. Prints it as Markdown and the
# time it took. Usage: bench/sim_table.sh [BUILD_DIR] [THREADS]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
threads=${2:-2}
data=$(cd "$(dirname "$0")/../data/openb" && pwd)
start=$(date +%s%N)
for pods in "$data"/openb_pod_list_*.csv; do
  trace=$(basename "$pods" .csv)
  trace=${trace#openb_pod_list_}
  echo "### $trace"
  echo
  echo "| policy | 100 % arrived | 130 % arrived |"
  echo "|---|---|---|"
  "$build/bin/tessera" sim --nodes "$data/openb_node_list_gpu_node.csv" --pods "$pods" \
    --policies all --seeds 42-51 --load 1.3 --threads "$threads" 2>/dev/null |
    awk 'NR > 2 { printf "| %s | %s %s %s | %s %s %s |\n", $1, $2, $3, $4, $5, $6, $7 }'
  echo
done
end=$(date +%s%N)
awk -v ns=$((end - start)) -v t="$threads" 'BEGIN { printf "whole table: %.1f s on %d threads\n", ns / 1e9, t }'
