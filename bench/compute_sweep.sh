#!/usr/bin/env bash
# The compute-share sweep as a report: runs the compute tests (which measure every share on
# the simulated device's own record) RUNS times and prints, per case, the share asked and the
# median and spread of what was achieved, then the bursting and priority figures.
# Usage: bench/compute_sweep.sh [BUILD_DIR] (RUNS=3 by default; about 2 minutes a run).
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

for run in $(seq "${RUNS:-3}"); do
  echo "run $run of ${RUNS:-3}..." >&2
  # A failed case is still reported (the table shows it); the exit status says so at the end.
  "$build/tests/compute_test" --gtest_output="json:$scratch/run$run.json" >/dev/null || true
done
python3 "$here/summarize_sweep.py" "$scratch"/run*.json | tee "$build/bench/compute_sweep.md"
