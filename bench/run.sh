#!/usr/bin/env bash
# Runs the hook benchmarks on the simulated GPU with repetitions and prints medians and
# ratios against calling the driver directly in the same run. Usage: bench/run.sh [BUILD_DIR]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

export TESSERA_SIM_STATE=$scratch/simgpu
export TESSERA_RUNTIME_DIR=$scratch
# One group for every hooked process, as `tessera run --group` makes it.
"$build/bin/tessera" run --memory 64GiB --group bench --keep -- true 2>/dev/null
export TESSERA_LEDGER=$scratch/bench.ledger

LD_LIBRARY_PATH=$build/sim "$build/bench/bench_hook" \
  --benchmark_repetitions="${REPETITIONS:-7}" --benchmark_min_time=0.3 \
  --benchmark_out="$scratch/results.json" --benchmark_out_format=json >/dev/null
# The same launches once more with a compute share in force: every hooked launch is paced.
TESSERA_CORE_LIMIT=100 LD_LIBRARY_PATH=$build/sim "$build/bench/bench_hook" \
  --benchmark_filter=LaunchKernel \
  --benchmark_repetitions="${REPETITIONS:-7}" --benchmark_min_time=0.3 \
  --benchmark_out="$scratch/limited.json" --benchmark_out_format=json >/dev/null
# And with a low priority (no high-priority work about): every launch looks for it first.
TESSERA_PRIORITY=low LD_LIBRARY_PATH=$build/sim "$build/bench/bench_hook" \
  --benchmark_filter=LaunchKernelTimed \
  --benchmark_repetitions="${REPETITIONS:-7}" --benchmark_min_time=0.3 \
  --benchmark_out="$scratch/low.json" --benchmark_out_format=json >/dev/null
python3 "$here/summarize.py" "$scratch/results.json" "$scratch/limited.json" "$scratch/low.json" |
  tee "$build/bench/results.md"
