#!/usr/bin/env bash
# Tessera's GPU check, for a machine with an NVIDIA GPU and driver (and no network).
# Builds the hook with the C++ compiler alone (it needs nothing but libc), builds small CUDA
# programs with nvcc if present, runs them and the Python frameworks that are installed under
# an 8 GiB quota, and prints a table: the total each saw, what it could allocate before
# running out, and the error it got. Then compute shares: a saturating kernel loop at 10 to
# 70 %, a graph-launch loop and a 30/70 pair, asked against achieved; and the p99 latency of
# a PyTorch inference loop beside a PyTorch training loop, with and without priorities, and
# the priority matrix with real spin kernels (20 us to 5 ms, plain and graphs, Poisson). Then
# MPS: a private control daemon (its own pipe directory, stopped at the end) with NVIDIA's
# defaults for 2 replicas, two clients under the hook side by side, and a pod of three clients
# sharing one ledger.
# Read-only with respect to the GPU's settings (an MPS daemon changes none of them).
# Usage: scripts/gpu-check/run.sh [OUTPUT_DIR]
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-$(mktemp -d)}}
work=$(mktemp -d)
quota=${QUOTA:-8GiB}
mkdir -p "$out"

if [ "${GPU_CHECK_BUILD_ONLY:-0}" != 1 ]; then
  echo "== GPU (read-only NVML query)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,mig.mode.current --format=csv 2>&1 | tee "$out/gpu.csv"
fi

echo "== Building the hook"
g++ -std=c++20 -O2 -fPIC -shared -I"$repo/src" -fno-exceptions -fno-rtti -fno-threadsafe-statics \
  -fvisibility=hidden -fvisibility-inlines-hidden -Wl,--as-needed -Wl,-z,defs \
  -Wl,--version-script="$repo/src/hook/exports.map" -Wl,-Bsymbolic-functions \
  "$repo"/src/hook/*.cpp "$repo"/src/ledger/{ledger,demand}.cpp \
  "$repo"/src/common/{units,limits,priority,log,shared_file,member_accounts}.cpp \
  -o "$work/libtessera-cuda.so" -ldl -lpthread || { echo "hook build failed"; exit 1; }
hook="$work/libtessera-cuda.so"
# The node agent's NVML reading and the MIG catalog probe; fmt header-only, so the machine
# needs its headers alone (FMT_INCLUDE names a folder that holds fmt/ where it is not installed).
g++ -std=c++20 -O2 -DFMT_HEADER_ONLY -I"$repo/src" ${FMT_INCLUDE:+-I"$FMT_INCLUDE"} \
  "$repo"/src/node/{nvml,mig_gpu}.cpp "$repo"/src/mig/{catalog,nvml_catalog,planner}.cpp \
  "$repo"/src/base/strings.cpp \
  "$repo/scripts/gpu-check/nvml_probe.cpp" -o "$work/nvml_probe" -ldl ||
  { echo "nvml_probe build failed"; exit 1; }
# The test suite builds the hook and the probe this way too (GPU_CHECK_BUILD_ONLY=1), so these
# lines stay true.
[ "${GPU_CHECK_BUILD_ONLY:-0}" = 1 ] && { echo "hook built"; rm -rf "$work"; exit 0; }

echo "== Building the CUDA programs"
driver_lib=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
g++ -std=c++20 -O2 -I"$repo/src" -I"$repo/tests" "$repo/tests/workers/cuda_worker.cpp" -o "$work/cuda_worker" \
  "$driver_lib" "$(ldconfig -p | awk '/libnvidia-ml.so.1 /{print $NF; exit}')" -lpthread -ldl
g++ -std=c++20 -O2 -I"$repo/src" "$repo/examples/workloads/vmm_allocator.cpp" -o "$work/vmm_allocator" \
  "$driver_lib" -lpthread
if command -v nvcc >/dev/null; then
  nvcc -O2 -o "$work/alloc_until_oom" "$repo/scripts/gpu-check/alloc_until_oom.cu"
  nvcc -O2 -o "$work/compute_share" "$repo/scripts/gpu-check/compute_share.cu"
  nvcc -O2 -o "$work/priority_matrix" "$repo/scripts/gpu-check/priority_matrix.cu"
else
  echo "nvcc not found: runtime-API programs skipped"
fi

echo "== NVML as the node agent reads it, and the MIG catalog (read-only)"
probe=""
if [ -x "$work/nvml_probe" ]; then
  probe=$("$work/nvml_probe" 2>&1)
  echo "$probe"
  nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,compute_cap --format=csv,noheader 2>&1 |
    sed 's/^/  nvidia-smi: /'
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

echo "== Compute shares (each kernel loop saturates the GPU; achieved from CUDA-event timings)"
shares=()
share_row() { shares+=("| $1 | $2 | $3 |"); echo "  $1: asked $2, achieved $3"; }
if [ -x "$work/compute_share" ]; then
  share_row "kernel loop, no share" "-" "$(field achieved "$(env LD_PRELOAD="$hook" "$work/compute_share" 3 2>&1)")"
  for share in 10 30 50 70; do
    result=$(env LD_PRELOAD="$hook" TESSERA_CORE_LIMIT=$share "$work/compute_share" 3 2>&1)
    share_row "kernel loop" "$share" "$(field achieved "$result")"
  done
  result=$(env LD_PRELOAD="$hook" TESSERA_CORE_LIMIT=30 "$work/compute_share" 3 graph 2>&1)
  share_row "graph-launch loop" 30 "$(field achieved "$result")"
  env LD_PRELOAD="$hook" TESSERA_CORE_LIMIT=30 "$work/compute_share" 4 >"$work/pair30" 2>&1 &
  result=$(env LD_PRELOAD="$hook" TESSERA_CORE_LIMIT=70 "$work/compute_share" 4 2>&1)
  wait
  share_row "pair: first loop" 30 "$(field achieved "$(cat "$work/pair30")")"
  share_row "pair: second loop" 70 "$(field achieved "$result")"
fi

echo "== Priority matrix (1 ms spin kernels at 50 % duty, high priority, beside low-priority spin kernels)"
matrix=()
if [ -x "$work/priority_matrix" ]; then
  mkdir -p "$work/prio"
  serve_p99() {  # the interactive client under the hook at high priority; extra args: its LOAD
    env LD_PRELOAD="$hook" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/prio/serve.cache" TESSERA_PRIORITY=high \
      "$work/priority_matrix" serve 300 "$@" 2>&1 | sed -n 's/^p99_us=//p'
  }
  # One row: the batch kernel's length and mode, then the serve's load (empty: periodic).
  matrix_row() {
    local us=$1 mode=$2 load=${3:-}
    local alone beside
    alone=$(serve_p99 $load)
    env LD_PRELOAD="$hook" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/prio/batch.cache" TESSERA_PRIORITY=low \
      "$work/priority_matrix" batch "$us" 3 "$mode" >"$work/prio/batch.out" 2>&1 &
    local batch=$!
    for _ in $(seq 300); do grep -q started "$work/prio/batch.out" && break; sleep 0.01; done
    beside=$(serve_p99 $load)
    wait "$batch"
    local share
    share=$(field achieved "$(cat "$work/prio/batch.out")")
    local change
    change=$(awk -v a="$alone" -v b="$beside" 'BEGIN { if (a > 0) printf "%+.1f %%", 100 * (b / a - 1); else print "-" }')
    matrix+=("| ${us} us ${mode}${load:+, Poisson $load %} | $alone | $beside | $change | $share % |")
    echo "  batch ${us} us ${mode}${load:+ (Poisson $load %)}: p99 alone $alone us, beside $beside us ($change), batch $share %"
  }
  for us in 20 200 1000 5000; do
    for mode in plain graph; do matrix_row "$us" "$mode"; done
  done
  for load in 30 60; do matrix_row 200 plain "$load"; done
fi

echo "== Priority (PyTorch inference at 50 % duty beside PyTorch training)"
priority_row=""
if python3 -c "import torch" 2>/dev/null; then
  program="$repo/scripts/gpu-check/torch_priority.py"
  serve() {
    env LD_PRELOAD="$hook" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/serve.cache" CUDA_TASK_PRIORITY=0 \
      python3 "$program" serve 300 2>&1
  }
  # p99 of the inference loop beside a training loop run with the given environment.
  beside_training() {
    env LD_PRELOAD="$hook" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/train-$1.cache" "${@:2}" \
      python3 "$program" train 120 >"$work/train.out" 2>&1 &
    local trainer=$!
    for _ in $(seq 600); do grep -q started "$work/train.out" && break; sleep 0.1; done
    field p99_ms "$(serve)"
    kill "$trainer" 2>/dev/null
    wait "$trainer" 2>/dev/null
  }
  alone=$(field p99_ms "$(serve)")
  unprioritised=$(beside_training none)
  low=$(beside_training low CUDA_TASK_PRIORITY=1)
  priority_row="| $alone ms | $unprioritised ms | $low ms |"
  echo "  p99 alone $alone ms, beside training $unprioritised ms, beside low-priority training $low ms"
else
  echo "  torch not installed: skipped"
fi

echo "== MPS (a private daemon: its own pipe directory, NVIDIA's defaults for 2 replicas)"
mps_rows=()
mps_row() { mps_rows+=("| $1 | $2 |"); echo "  $1: $2"; }
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY="$work/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$work/mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  mps() { echo "$1" | timeout 10 nvidia-cuda-mps-control 2>&1; }
  stop_mps() { mps quit >/dev/null; }
  trap stop_mps EXIT
  if nvidia-cuda-mps-control -d; then
    total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)  # MiB
    pinned=$((total / 2))
    mps_row "daemon answers set_default_active_thread_percentage 50" "$(mps 'set_default_active_thread_percentage 50')"
    mps_row "daemon answers set_default_device_pinned_mem_limit 0 ${pinned}M" \
      "$(mps "set_default_device_pinned_mem_limit 0 ${pinned}M")"
    # One client under the hook at a larger quota: MPS's pinned limit is the one that holds.
    result=$(env LD_PRELOAD="$hook" TESSERA_MEMORY_LIMIT=$((total * 3 / 4))MiB \
      "$work/cuda_worker" fill $((256 << 20)) 2>&1)
    mps_row "client fill (hook quota 3/4, MPS limit 1/2 of ${total} MiB)" \
      "total $(gib "$(field total "$result")"), allocated $(gib "$(field allocated "$result")"), error $(field error "$result")"
    result=$(env LD_PRELOAD="$hook" "$work/cuda_worker" info 2>&1)
    mps_row "client's SM count at 50 %" "$(field device_sms "$result")"
    if [ -x "$work/compute_share" ]; then
      env LD_PRELOAD="$hook" "$work/compute_share" 4 >"$work/mps-first" 2>&1 &
      result=$(env LD_PRELOAD="$hook" "$work/compute_share" 4 2>&1)
      wait
      mps_row "two kernel loops side by side: achieved" \
        "$(field achieved "$(cat "$work/mps-first")") % and $(field achieved "$result") %"
    fi
    mps_row "get_server_list" "$(mps get_server_list | tr '\n' ' ')"
    # A pod of three clients sharing one ledger with a quota of a quarter: each asks 40 % of
    # it, which MPS alone would give all three.
    ledger="$work/mps-pod.ledger"
    holders=()
    for i in 1 2 3; do
      mkfifo "$work/holder-$i"
      env LD_PRELOAD="$hook" CUDA_DEVICE_MEMORY_SHARED_CACHE="$ledger" TESSERA_MEMORY_LIMIT=$((total / 4))MiB \
        "$work/cuda_worker" hold $((total / 10 << 20)) <"$work/holder-$i" >"$work/holder-$i.out" 2>&1 &
      exec {keep}>"$work/holder-$i"  # its stdin, open until all three have asked
      eval "holder_in_$i=$keep"
      for _ in $(seq 300); do grep -q '^result=' "$work/holder-$i.out" && break; sleep 0.1; done
      holders+=("$(field result "$(cat "$work/holder-$i.out")")")
    done
    for i in 1 2 3; do eval "exec {holder_in_$i}>&-"; done
    wait
    mps_row "pod of three clients (quota 1/4, each asks 1/10): results" "${holders[*]} (2 = out of memory)"
  else
    mps_row "daemon" "nvidia-cuda-mps-control -d failed"
  fi
  stop_mps
  trap - EXIT
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
  echo "  nvidia-cuda-mps-control not found: skipped"
fi

{
  echo "| program | total seen | allocated before OOM | error |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  if [ ${#shares[@]} -gt 0 ]; then
    echo
    echo "| compute | share asked (%) | achieved (%) |"
    echo "|---|---|---|"
    printf '%s\n' "${shares[@]}"
  fi
  if [ -n "$probe" ]; then
    echo
    echo "NVML probe (tessera node's inventory and the MIG catalog):"
    echo '```'
    echo "$probe"
    echo '```'
  fi
  if [ ${#matrix[@]} -gt 0 ]; then
    echo
    echo "| batch kernels (low priority) | p99 alone (us) | p99 beside (us) | change | batch share over its 3 s |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${matrix[@]}"
  fi
  if [ -n "$priority_row" ]; then
    echo
    echo "| inference p99: alone (high priority) | beside training | beside low-priority training |"
    echo "|---|---|---|"
    echo "$priority_row"
  fi
  if [ ${#mps_rows[@]} -gt 0 ]; then
    echo
    echo "| MPS | result |"
    echo "|---|---|"
    printf '%s\n' "${mps_rows[@]}"
  fi
} | tee "$out/gpu-check.md"
rm -rf "$work"
