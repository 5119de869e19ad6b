// ResourceClaims as NodePrepareResources reads them from the API server: whatever the claim
// holds, the reader gives this node's devices with capacities in range, or a ClaimError; and
// what it accepts is checked against the node's published devices without crashing.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "contract/dra.h"
#include "dra/claim.h"
#include "dra/pool.h"
#include "fuzz_input.h"
#include "kube/json_input.h"

using namespace tessera;
using tessera::fuzz::broken;

namespace {

node::Inventory machine() {
  node::Inventory inventory;
  inventory.driver_version = "580.65.06";
  for (unsigned i = 0; i < 2; ++i) {
    node::GpuInfo gpu;
    gpu.index = i;
    gpu.uuid = "GPU-7e55e7a0-0000-4000-8000-00000000000" + std::to_string(i);
    gpu.name = "NVIDIA H100 80GB HBM3";
    gpu.memory_bytes = 81559ull << 20;
    gpu.cc_major = 9;
    gpu.mig_capable = true;
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const node::Inventory inventory = machine();
  nlohmann::json claim;
  try {
    claim = kube::parse_outside_json(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const std::exception&) {
    return 0;
  }
  // The UID the claim states, so that the fuzzer gets past the check that it is the one asked for.
  const dra::ClaimRef ref{"default",
                          claim.is_object() && claim.contains("metadata")
                              ? kube::string_at(claim["metadata"], "/uid"_json_pointer)
                              : "",
                          "fuzz"};
  std::vector<dra::AllocatedDevice> devices;
  try {
    devices = dra::read_claim_allocation(claim, ref, contract::kDraDriverName, "gpu-node");
  } catch (const dra::ClaimError&) {
    return 0;
  }
  if (devices.empty() || devices.size() > dra::kMostClaimDevices) broken("device count");
  for (const dra::AllocatedDevice& device : devices) {
    if (device.pool != "gpu-node") broken("a device of another pool was accepted");
    if (device.cores && (*device.cores < 1 || *device.cores > 100)) broken("cores out of range");
    if (device.memory_bytes && *device.memory_bytes == 0) broken("no memory was accepted");
    if (device.device.empty() || device.device.size() > 253) broken("device name");
    (void)dra::find_published_device(inventory, device.device);
  }
  return 0;
}
