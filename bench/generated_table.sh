#!/usr/bin/env bash
# FGD against the default policy (and fgd-packed) on traces generated from data/openb's default
# trace in the shapes of bench/generated_shapes.txt, seeds 42-51, at 100 % and 130 % arrived.
# The traces are written under BUILD_DIR/generated-traces (not kept in git). Prints a Markdown
# row per shape with mean ± sd and fgd-balanced − fgd, then the worst and mean differences.
# Usage: bench/generated_table.sh [BUILD_DIR] [THREADS] [SEEDS]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
threads=${2:-2}
seeds=${3:-42-51}
here=$(cd "$(dirname "$0")" && pwd)
data=$(cd "$here/../data/openb" && pwd)
nodes="$data/openb_node_list_gpu_node.csv"
out="$build/generated-traces"
mkdir -p "$out"
start=$(date +%s%N)
echo "| set | shape | fgd 100 / 130 | fgd-packed 100 / 130 | fgd-balanced 100 / 130 | fgd-balanced − fgd |"
echo "|---|---|---|---|---|---|"
index=0
grep -v '^#' "$here/generated_shapes.txt" | while read -r set name options; do
  index=$((index + 1))
  trace="$out/$name.csv"
  # shellcheck disable=SC2086 # the options are words
  [ -f "$trace" ] || "$build/bin/tessera" gen-trace --nodes "$nodes" --from "$data/openb_pod_list_default.csv" \
    --seed $((1000 + index)) --output "$trace" $options 2>/dev/null
  "$build/bin/tessera" sim --nodes "$nodes" --pods "$trace" --policies fgd,fgd-packed,fgd-balanced \
    --seeds "$seeds" --threads "$threads" --no-references 2>/dev/null |
    awk -v set="$set" -v name="$name" '
      NR > 2 { mean100[$1] = $2; sd100[$1] = $4; mean130[$1] = $5; sd130[$1] = $7 }
      END {
        printf "| %s | %s |", set, name
        split("fgd fgd-packed fgd-balanced", policies, " ")
        for (i = 1; i <= 3; ++i) {
          p = policies[i]
          printf " %.2f ± %.2f / %.2f ± %.2f |", mean100[p], sd100[p], mean130[p], sd130[p]
        }
        printf " %+.2f / %+.2f |\n", mean100["fgd-balanced"] - mean100["fgd"], mean130["fgd-balanced"] - mean130["fgd"]
      }'
done | tee "$out/table.md"
awk -F'|' '{ split($7, d, "/");
  set = $2; gsub(/ /, "", set); a = d[1] + 0; b = d[2] + 0
  if (!(set in worst100) || a < worst100[set]) worst100[set] = a
  if (!(set in worst130) || b < worst130[set]) worst130[set] = b
  sum100[set] += a; sum130[set] += b; n[set]++ }
  END { for (s in n) printf "%s: %d shapes, fgd-balanced − fgd worst %+.2f / %+.2f, mean %+.2f / %+.2f\n", s, n[s], worst100[s], worst130[s], sum100[s] / n[s], sum130[s] / n[s] }' "$out/table.md"
end=$(date +%s%N)
awk -v ns=$((end - start)) 'BEGIN { printf "took %.1f s\n", ns / 1e9 }'
