#!/usr/bin/env bash
# The mixed-MIG table: every trace in data/openb/ on the openb cluster with a third of its
# 8-GPU nodes holding 4 MIG-capable A100-40GB GPUs cut 3g + 2g + 1g + 1g, a share of the
# sharing pods (25, 50, 100 %) asking for MIG profiles; fgd-balanced with static layouts and
# with dynamic MIG, seeds 42-51, at 100 % and 130 % arrived, and the re-cuts and MIG mode
# changes per 1,000 arrived pods. Prints Markdown. Usage: bench/mig_table.sh [BUILD_DIR] [THREADS]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
threads=${2:-2}
data=$(cd "$(dirname "$0")/../data/openb" && pwd)
start=$(date +%s%N)
sim() {
  "$build/bin/tessera" sim --nodes "$data/openb_node_list_gpu_node.csv" --pods "$1" \
    --policies fgd-balanced --seeds 42-51 --load 1.3 --threads "$threads" \
    --mig-nodes 0.3334 --mig-gpus 4 --mig-pods "$2" "${@:3}" 2>/dev/null
}
echo "| trace | MIG pods | static 100 % | static 130 % | dynamic 100 % | dynamic 130 % | re-cuts / 1k pods | mode changes / 1k pods |"
echo "|---|---|---|---|---|---|---|---|"
for pods in "$data"/openb_pod_list_*.csv; do
  trace=$(basename "$pods" .csv)
  trace=${trace#openb_pod_list_}
  for share in 0.25 0.5 1; do
    static=$(sim "$pods" "$share" | awk '$1 == "fgd-balanced" { print $2 " ± " $4 " | " $5 " ± " $7; exit }')
    dynamic=$(sim "$pods" "$share" --dynamic-mig)
    allocation=$(awk '$1 == "fgd-balanced" && NF == 7 { print $2 " ± " $4 " | " $5 " ± " $7; exit }' <<<"$dynamic")
    # The dynamic MIG line: policy, re-cuts, mode changes (per run), re-cuts/1k, modes/1k, GPU-s.
    changes=$(awk '/^Dynamic MIG/ { on = 1; next } on && $1 == "fgd-balanced" { print $4 " | " $5; exit }' <<<"$dynamic")
    echo "| $trace | $(awk -v s="$share" 'BEGIN { printf "%d %%", s * 100 }') | $static | $allocation | $changes |"
  done
done
end=$(date +%s%N)
awk -v ns=$((end - start)) -v t="$threads" 'BEGIN { printf "\nwhole table: %.1f s on %d threads\n", ns / 1e9, t }'
