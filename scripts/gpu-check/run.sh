#!/usr/bin/env bash
# Tessera's GPU check, for a machine with an NVIDIA GPU and driver (and no network).
# Builds the hook with the C++ compiler alone (it needs nothing but libc), builds small CUDA
# programs with nvcc if present, runs them and the Python frameworks that are installed under
# an 8 GiB quota, and prints a table: the total each saw, what it could allocate before
# running out, and the error it got. Read-only with respect to the GPU's settings.
# Usage: scripts/gpu-check/run.sh [OUTPUT_DIR]
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-$(mktemp -d)}}
work=$(mktemp -d)
quota=${QUOTA:-8GiB}
mkdir -p "$out"

echo "== GPU (read-only NVML query)"
nvidia-smi --query-gpu=name,memory.total,driver_version,mig.mode.current --format=csv 2>&1 | tee "$out/gpu.csv"

echo "== Building the hook"
g++ -std=c++20 -O2 -fPIC -shared -I"$repo/src" -fno-exceptions -fno-rtti -fno-threadsafe-statics \
  -fvisibility=hidden -fvisibility-inlines-hidden -Wl,--as-needed -Wl,-z,defs \
  -Wl,--version-script="$repo/src/hook/exports.map" -Wl,-Bsymbolic-functions \
  "$repo"/src/hook/*.cpp "$repo/src/ledger/ledger.cpp" "$repo"/src/common/{units,limits,log,shared_file,member_accounts}.cpp \
  -o "$work/libtessera-cuda.so" -ldl -lpthread || { echo "hook build failed"; exit 1; }
hook="$work/libtessera-cuda.so"

echo "== Building the CUDA programs"
driver_lib=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
g++ -std=c++20 -O2 -I"$repo/src" "$repo/tests/workers/cuda_worker.cpp" -o "$work/cuda_worker" \
  "$driver_lib" "$(ldconfig -p | awk '/libnvidia-ml.so.1 /{print $NF; exit}')" -lpthread -ldl
g++ -std=c++20 -O2 -I"$repo/src" "$repo/examples/workloads/vmm_allocator.cpp" -o "$work/vmm_allocator" \
  "$driver_lib" -lpthread
if command -v nvcc >/dev/null; then
  nvcc -O2 -o "$work/alloc_until_oom" "$repo/scripts/gpu-check/alloc_until_oom.cu"
else
  echo "nvcc not found: runtime-API programs skipped"
fi

limited() { env LD_PRELOAD="$hook" TESSERA_MEMORY_LIMIT="$quota" "$@"; }
rows=()
row() { rows+=("| $1 | $2 | $3 | $4 |"); echo "  $1: total $2, allocated $3, error $4"; }
field() { sed -n "s/^$1=//p" <<<"$2" | head -1; }
gib() { awk -v b="$1" 'BEGIN { if (b == "") print "-"; else printf "%.2f GiB", b / 1073741824 }'; }

echo "== Running under a $quota quota"
if [ -x "$work/alloc_until_oom" ]; then
  for mode in malloc async managed; do
    result=$(limited "$work/alloc_until_oom" "$mode" 256 2>&1)
    row "runtime API cudaMalloc${mode/malloc/}" "$(gib "$(field total "$result")")" \
      "$(gib "$(field allocated "$result")")" "$(field error "$result")"
  done
fi
result=$(limited "$work/cuda_worker" fill $((256 << 20)) 2>&1)
row "driver API cuMemAlloc" "$(gib "$(field total "$result")")" "$(gib "$(field allocated "$result")")" \
  "$(field error "$result")"
result=$(limited "$work/vmm_allocator" 512MiB 2>&1)
row "driver API VMM (cuMemCreate/cuMemMap)" "-" "$(grep -o 'mapped [0-9.]* GiB' <<<"$result" | head -1)" \
  "$(grep -o 'CUDA_ERROR_[A-Z_]*' <<<"$result" | head -1)"

python_check() {
  local name=$1 program=$2
  shift 2
  if ! python3 -c "import ${name%%-*}" 2>/dev/null; then
    echo "  $name not installed: skipped"
    return
  fi
  result=$(env "$@" LD_PRELOAD="$hook" TESSERA_MEMORY_LIMIT="$quota" python3 -c "$program" 2>&1 | tail -5)
  row "$name" "$(gib "$(field total "$result")")" "$(gib "$(field allocated "$result")")" "$(field error "$result")"
}
torch_program='
import torch
free, total = torch.cuda.mem_get_info()
held, error = [], "none"
try:
    while True:
        held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:
    error = "torch.OutOfMemoryError"
except Exception as e:
    error = type(e).__name__ + ": " + str(e).splitlines()[0][:60]
print(f"total={total}\nallocated={len(held) * (256 << 20)}\nerror={error}")'
python_check torch "$torch_program"
python_check torch-expandable "$torch_program" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python_check torch-cudaMallocAsync "$torch_program" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
python_check cupy '
import cupy
free, total = cupy.cuda.runtime.memGetInfo()
held, error = [], "none"
try:
    while True:
        held.append(cupy.empty(256 << 20, dtype=cupy.uint8))
except cupy.cuda.memory.OutOfMemoryError:
    error = "cupy OutOfMemoryError"
except Exception as e:
    error = type(e).__name__
print(f"total={total}\nallocated={len(held) * (256 << 20)}\nerror={error}")'

{
  echo "| program | total seen | allocated before OOM | error |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/gpu-check.md"
rm -rf "$work"
