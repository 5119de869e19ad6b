#!/usr/bin/env bash
# The main job: several workloads share one GPU in groups with different memory quotas.
# Without an NVIDIA driver it runs on the simulated GPU (and says so); with one, on the GPU.
# Usage: examples/demo.sh [BUILD_DIR]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
tessera="$build/bin/tessera"
workloads="$build/examples"

# The demo's groups live in a directory of their own, removed at the end.
TESSERA_RUNTIME_DIR=$(mktemp -d)
export TESSERA_RUNTIME_DIR
trap 'rm -rf "$TESSERA_RUNTIME_DIR"' EXIT

echo "== The GPUs this machine has"
"$tessera" devices
echo
echo "== Four workloads share GPU 0 in three groups"
echo "   inference (12 GiB, two replicas of a model server sharing the quota)"
echo "   training  (20 GiB, a trainer that takes all it can get)"
echo "   batch     (6 GiB, an allocator growing with cuMemCreate/cuMemMap)"
echo
run() { "$tessera" run --device 0 --keep "$@" 2> >(grep -v "using the simulated GPU" >&2); }
pids=()
run --group inference --memory 12GiB -- "$workloads/model_server" 5GiB 300 256MiB & pids+=($!)
run --group inference --memory 12GiB -- "$workloads/model_server" 5GiB 300 256MiB & pids+=($!)
run --group training --memory 20GiB -- "$workloads/greedy_trainer" 1GiB & pids+=($!)
run --group batch --memory 6GiB -- "$workloads/vmm_allocator" 512MiB & pids+=($!)
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
echo
echo "== Each group's limit, peak and refused allocations (tessera top --once)"
"$tessera" top --once
echo
if [ "$failed" = 0 ]; then
  echo "Every workload finished: the servers were never refused, and the trainer and the"
  echo "allocator met their own group's limit as a clean CUDA_ERROR_OUT_OF_MEMORY."
else
  echo "A workload failed: see its output above." >&2
  exit 1
fi
