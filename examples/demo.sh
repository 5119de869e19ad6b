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

# The node agent, as a Kubernetes node runs it, serving a test kubelet (real gRPC) on a
# simulated node of four T4s with the time-slicing article's config for them.
echo
echo "== tessera node on a simulated node of four T4s, config tesla-t4 (4 replicas a GPU)"
node_dir="$TESSERA_RUNTIME_DIR/node"
mkdir -p "$node_dir"
export TESSERA_SIMULATE=1 TESSERA_SIM_DEVICES="T4;T4;T4;T4" TESSERA_SIM_STATE="$node_dir/sim"
"$tessera" node --node-name demo-node --device-plugin-dir "$node_dir/kubelet" \
  --state-dir "$node_dir/state" --features-dir "$node_dir" \
  --config-file "$(dirname "$0")/node-configs/seed-tesla-t4.yaml" >/dev/null 2>"$node_dir/log" &
node_pid=$!
trap 'kill "$node_pid" 2>/dev/null || true; rm -rf "$TESSERA_RUNTIME_DIR"' EXIT
"$build/bin/test-kubelet" "$node_dir/kubelet" nvidia.com/gpu --allocate 1
echo
echo "   labels for node-feature-discovery ($node_dir/tessera-gpu):"
grep -E "gpu\.(count|product|replicas|sharing)=" "$node_dir/tessera-gpu" | sed 's/^/     /'
echo
echo "== GPU 2 raises XID 79 (fallen off the bus): every replica of it goes unhealthy"
"$tessera" simgpu event --device 2 --xid 79
# A kubelet started now registers the plugin anew, and waits for the devices' health to show.
listed=$("$build/bin/test-kubelet" "$node_dir/kubelet" nvidia.com/gpu --unhealthy 4)
echo "$listed" | grep -E "registered|Unhealthy"
unhealthy=$(echo "$listed" | grep -c Unhealthy || true)
kill "$node_pid"
wait "$node_pid" || true
echo
echo "   the agent's log:"
sed 's/^/     /' "$node_dir/log"
if [ "$unhealthy" = 4 ]; then
  echo "The node agent served 16 replicas to the kubelet, and all 4 of GPU 2's went unhealthy."
else
  echo "The node agent did not mark GPU 2's 4 replicas unhealthy (saw $unhealthy)." >&2
  exit 1
fi

# MIG with tessera mig, on a simulated A100-80GB: the GPU-sharing chapter's mixed layout
# (3g.40gb + 2g.20gb x2), which fits only with the 3g on the right half.
echo
echo "== tessera mig on a simulated A100-80GB: the chapter's mig-parted config, config mixed"
export TESSERA_SIM_DEVICES="A100-80GB" TESSERA_SIM_STATE="$TESSERA_RUNTIME_DIR/mig-sim"
mig_config="$(dirname "$0")/mig/seed-chapter-mig-parted.yaml"
"$tessera" mig plan -f "$mig_config" --model A100-80GB | sed 's/^/   /'
# MIG mode on waits for a GPU reset: apply says so and exits 3.
status=0
"$tessera" mig apply -f "$mig_config" -c mixed | sed 's/^/   /' || status=$?
if [ "$status" != 3 ]; then
  echo "tessera mig apply should have waited for a reset (exit 3), exited $status" >&2
  exit 1
fi
"$tessera" simgpu reset --device 0 | sed 's/^/   /'
"$tessera" mig apply -f "$mig_config" -c mixed | sed 's/^/   /'
"$tessera" mig show | sed 's/^/   /'
devices=$("$tessera" mig show | grep -c " MIG-" || true)
if [ "$devices" = 3 ]; then
  echo "tessera mig made the chapter's three MIG devices, each at a placement it chose."
else
  echo "tessera mig did not make the 3 MIG devices (saw $devices)." >&2
  exit 1
fi

# Tessera as a DRA driver: the same agent with --dra, its plugin registered by the kubelet's DRA
# side, its ResourceSlices published to an API server, and a shared claim prepared with its
# exact limits and removed again.
echo
echo "== tessera node --dra on a simulated node of two H100s"
dra_dir="$TESSERA_RUNTIME_DIR/dra"
mkdir -p "$dra_dir"
export TESSERA_SIM_DEVICES="H100;H100" TESSERA_SIM_STATE="$dra_dir/sim"
"$build/bin/test-dra" "$dra_dir/plugins_registry" -- "$tessera" node --dra \
  --state-dir "$dra_dir/state" --plugins-registry-dir "$dra_dir/plugins_registry" \
  --plugins-dir "$dra_dir/plugins" --cdi-dir "$dra_dir/cdi" --device-plugin-dir "$dra_dir/dp" \
  2>"$dra_dir/log" | sed 's/^/   /'
if grep -q "dra: prepared claim default/inference-gpu" "$dra_dir/log" &&
  grep -q "dra: unprepared claim default/inference-gpu" "$dra_dir/log"; then
  echo "The DRA driver published the node's GPUs and prepared a 4 GiB, 30-core claim through CDI."
  grep -E "dra: (prepared|unprepared)" "$dra_dir/log" | sed 's/^/     /'
else
  echo "The DRA driver did not prepare and unprepare the claim; its log:" >&2
  cat "$dra_dir/log" >&2
  exit 1
fi
