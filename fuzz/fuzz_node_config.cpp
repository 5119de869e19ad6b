// The node agent's config files (NVIDIA's device-plugin config v1 and Tessera's slices), as
// a ConfigMap edited by anyone may hold them: whatever the bytes, reading gives a checked
// config or a ConfigError, and an accepted config gives a resource map within bounds, labels
// Kubernetes takes and an annotation the scheduler reads back.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "contract/annotations.h"
#include "extender/cluster_objects.h"
#include "fuzz_input.h"
#include "node/config.h"
#include "node/labels.h"
#include "node/resources.h"

using namespace tessera::node;
using tessera::fuzz::broken;

namespace {

Inventory machine() {
  Inventory inventory;
  inventory.driver_version = "580.65.06";
  for (unsigned i = 0; i < 4; ++i) {
    GpuInfo gpu;
    gpu.index = i;
    gpu.uuid = "GPU-7e55e7a0-0000-4000-8000-00000000000" + std::to_string(i);
    gpu.name = "NVIDIA A100-SXM4-40GB";
    gpu.memory_bytes = 40960ull << 20;
    gpu.cc_major = 8;
    gpu.mig_capable = true;
    gpu.mig_enabled = i == 3;
    gpu.numa_node = static_cast<int>(i / 2);
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Inventory inventory = machine();
  PluginConfig config;
  try {
    config =
        parse_plugin_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const ConfigError&) {
    return 0;
  }
  for (const SharedResource& resource : config.time_slicing.resources) {
    if (resource.replicas < 2 || resource.replicas > 1024)
      broken("time-slicing replicas out of range");
  }
  for (const SharedResource& resource : config.slices.resources) {
    if (resource.cores_per_slice < 0 || resource.cores_per_slice > 100)
      broken("slice cores out of range");
  }
  ResourceMap map;
  try {
    map = build_resource_map(inventory, config);
  } catch (const ConfigError&) {
    return 0;
  }
  std::size_t devices = 0;
  for (const Resource& resource : map.resources) {
    if (resource.name.size() > 63 || resource.name.rfind("nvidia.com/", 0) != 0)
      broken("resource name");
    for (const AdvertisedDevice& device : resource.devices) {
      if (device.id.size() > kMostDeviceIdLength) broken("device ID longer than the kubelet takes");
      if (device.gpu < 0 || device.gpu >= 4) broken("device on a GPU the machine lacks");
    }
    devices += resource.devices.size();
  }
  if (devices > 4 * 1024) broken("more devices than GPUs times the most replicas");
  for (const auto& [key, value] : gpu_labels(inventory, config, 0)) {
    if (value.size() > 63) broken("label value too long");
    for (const char c : value) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
        broken("label value");
    }
  }
  HealthBoard health(4);
  const nlohmann::json annotation = gpus_annotation(inventory, map, health, config.strategy());
  nlohmann::json node = {
      {"metadata",
       {{"name", "n"}, {"annotations", {{tessera::contract::kGpusAnnotation, annotation.dump()}}}}},
      {"status", {{"allocatable", {{"cpu", "8"}, {"memory", "8Gi"}}}}}};
  try {
    const tessera::extender::NodeInfo info = tessera::extender::node_from_json(node);
    if (info.spec.gpus > 4) broken("the scheduler counts GPUs the node lacks");
  } catch (const std::exception&) {
    broken("the scheduler refuses the node agent's own annotation");
  }
  return 0;
}
