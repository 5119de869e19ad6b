#include "dra/pool.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>

#include "contract/dra.h"

namespace tessera::dra {
namespace {

using nlohmann::json;

constexpr std::size_t kMostDevicesPerSlice = 64;  // with counters or taints, as the API says
constexpr const char* kUnhealthyTaint = "gpu.tessera.io/unhealthy";

std::string architecture(int major, int minor) {
  switch (major) {
    case 7:
      return minor >= 5 ? "Turing" : "Volta";
    case 8:
      return minor >= 9 ? "Ada Lovelace" : "Ampere";
    case 9:
      return "Hopper";
    case 10:
    case 12:
      return "Blackwell";
    default:
      return "unknown";
  }
}

// A semantic version from NVIDIA's "580.65.06": no leading zeros, three parts.
std::string semantic_version(const std::string& text) {
  std::vector<unsigned long> parts;
  std::size_t at = 0;
  while (at < text.size() && parts.size() < 3) {
    std::size_t end = at;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == at) break;
    parts.push_back(std::stoul(text.substr(at, std::min<std::size_t>(end - at, 9))));
    at = end + 1;
  }
  while (parts.size() < 3) parts.push_back(0);
  return fmt::format("{}.{}.{}", parts[0], parts[1], parts[2]);
}

std::string counter_set(int gpu) {
  return fmt::format("gpu-{}-counters", gpu);
}
std::string slice_counter(int slice) {
  return fmt::format("memory-slice-{}", slice);
}

// A taint value is a label value: at most 63 of [A-Za-z0-9._-], starting and ending with one
// of [A-Za-z0-9].
std::string taint_value(const std::string& reason) {
  std::string value;
  for (const char c : reason) {
    if (value.size() == 63) break;
    const bool plain =
        std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    value += plain ? c : '-';
  }
  while (!value.empty() && !std::isalnum(static_cast<unsigned char>(value.back())))
    value.pop_back();
  while (!value.empty() && !std::isalnum(static_cast<unsigned char>(value.front())))
    value.erase(0, 1);
  return value;
}

json string_attribute(const std::string& value) {
  return {{"string", value}};
}

json gpu_attributes(const Inventory& inventory, const GpuInfo& gpu, const char* type) {
  return {
      {"type", string_attribute(type)},
      {"uuid", string_attribute(gpu.uuid)},
      {"index", {{"int", gpu.index}}},
      {"productName", string_attribute(gpu.name)},
      {"architecture", string_attribute(architecture(gpu.cc_major, gpu.cc_minor))},
      {"cudaComputeCapability", {{"version", fmt::format("{}.{}.0", gpu.cc_major, gpu.cc_minor)}}},
      {"driverVersion", {{"version", semantic_version(inventory.driver_version)}}},
      {"cudaDriverVersion",
       {{"version", fmt::format("{}.{}.0", inventory.cuda_major, inventory.cuda_minor)}}},
      {"pciBusID", string_attribute(gpu.pci_bus_id)}};
}

const mig::GpuModel* mig_model(const GpuInfo& gpu) {
  return gpu.mig_capable ? mig::find_model(gpu.name) : nullptr;
}

// What a device takes from its GPU's counter set.
json consumes(int gpu, std::uint64_t memory, int first_slice, int slices) {
  json counters = {{"memory", {{"value", memory_quantity(memory)}}}};
  for (int slice = first_slice; slice < first_slice + slices; ++slice) {
    counters[slice_counter(slice)] = {{"value", "1"}};
  }
  return json::array({{{"counterSet", counter_set(gpu)}, {"counters", counters}}});
}

std::string placement_name(int gpu, const mig::Profile& profile, int start) {
  std::string name = mig::resource_profile_name(profile.name);
  std::replace(name.begin(), name.end(), '.', '-');
  return fmt::format("gpu-{}-{}-{}", gpu, name, start);
}

json device_spec(const Inventory& inventory, const PublishedDevice& device,
                 const SharedDefaults& defaults) {
  const GpuInfo& gpu = inventory.gpus[static_cast<std::size_t>(device.gpu)];
  const mig::GpuModel* model = mig_model(gpu);
  const int all_slices = model != nullptr ? model->memory_slices : 0;
  json spec = {{"name", device.name}};
  switch (device.kind) {
    case DeviceKind::whole:
      spec["attributes"] = gpu_attributes(inventory, gpu, "gpu");
      spec["capacity"] = {{"memory", {{"value", memory_quantity(gpu.memory_bytes)}}}};
      spec["consumesCounters"] = consumes(device.gpu, gpu.memory_bytes, 0, all_slices);
      break;
    case DeviceKind::shared: {
      spec["attributes"] = gpu_attributes(inventory, gpu, "shared");
      spec["allowMultipleAllocations"] = true;
      const std::uint64_t memory_default = defaults.memory_on(gpu);
      spec["capacity"] = {{contract::kDraMemoryCapacity,
                           {{"value", memory_quantity(gpu.memory_bytes)},
                            {"requestPolicy",
                             {{"default", memory_quantity(memory_default)},
                              {"validRange",
                               {{"min", memory_quantity(kSharedMemoryStepBytes)},
                                {"max", memory_quantity(gpu.memory_bytes)},
                                {"step", memory_quantity(kSharedMemoryStepBytes)}}}}}}},
                          {contract::kDraCoresCapacity,
                           {{"value", "100"},
                            {"requestPolicy",
                             {{"default", std::to_string(defaults.cores_or_default())},
                              {"validRange", {{"min", "1"}, {"max", "100"}, {"step", "1"}}}}}}}};
      spec["consumesCounters"] = consumes(device.gpu, gpu.memory_bytes, 0, all_slices);
      break;
    }
    case DeviceKind::mig: {
      const MigDeviceInfo& mig = gpu.mig_devices[static_cast<std::size_t>(device.mig)];
      spec["attributes"] = {{"type", string_attribute("mig")},
                            {"uuid", string_attribute(mig.uuid)},
                            {"parentUUID", string_attribute(gpu.uuid)},
                            {"profile", string_attribute(mig.profile)},
                            {"productName", string_attribute(gpu.name)},
                            {"architecture", gpu_attributes(inventory, gpu, "")["architecture"]}};
      spec["capacity"] = {{"memory", {{"value", memory_quantity(mig.memory_bytes)}}},
                          {"multiprocessors", {{"value", std::to_string(mig.sm_count)}}}};
      spec["consumesCounters"] = consumes(device.gpu, mig.memory_bytes, 0, 0);
      break;
    }
    case DeviceKind::mig_placement: {
      const mig::Profile& profile = *device.profile;
      const std::uint64_t memory = profile.memory_mib << 20;
      spec["attributes"] = {{"type", string_attribute("mig-placement")},
                            {"parentUUID", string_attribute(gpu.uuid)},
                            {"profile", string_attribute(profile.name)},
                            {"placementStart", {{"int", device.start}}},
                            {"productName", string_attribute(gpu.name)}};
      spec["capacity"] = {{"memory", {{"value", memory_quantity(memory)}}},
                          {"multiprocessors", {{"value", std::to_string(profile.sm_count)}}}};
      spec["consumesCounters"] = consumes(device.gpu, memory, device.start, profile.memory_slices);
      break;
    }
  }
  return spec;
}

}  // namespace

std::uint64_t SharedDefaults::memory_on(const GpuInfo& gpu) const {
  std::uint64_t bytes = memory_per_slice;
  if (bytes == 0)
    bytes = replicas > 0 ? gpu.memory_bytes / static_cast<std::uint64_t>(replicas)
                         : kSharedMemoryDefaultBytes;
  bytes = bytes / kSharedMemoryStepBytes * kSharedMemoryStepBytes;
  const std::uint64_t most = gpu.memory_bytes / kSharedMemoryStepBytes * kSharedMemoryStepBytes;
  return std::clamp(bytes, kSharedMemoryStepBytes, std::max(most, kSharedMemoryStepBytes));
}

SharedDefaults shared_defaults(const node::PluginConfig& config) {
  SharedDefaults defaults;
  for (const node::SharedResource& resource : config.slices.resources) {
    if (resource.name != "nvidia.com/gpu") continue;
    defaults.memory_per_slice = resource.memory_per_slice;
    defaults.replicas = resource.replicas;
    defaults.cores = resource.cores_per_slice;
    break;
  }
  return defaults;
}

std::string memory_quantity(std::uint64_t bytes) {
  return fmt::format("{}Mi", (bytes + (std::uint64_t{1} << 20) - 1) >> 20);
}

std::vector<PublishedDevice> published_devices(const Inventory& inventory) {
  std::vector<PublishedDevice> devices;
  for (std::size_t index = 0; index < inventory.gpus.size(); ++index) {
    const GpuInfo& gpu = inventory.gpus[index];
    const int i = static_cast<int>(index);
    if (gpu.mig_enabled) {
      for (std::size_t mig = 0; mig < gpu.mig_devices.size(); ++mig) {
        devices.push_back({fmt::format("gpu-{}-mig-{}", i, gpu.mig_devices[mig].index),
                           DeviceKind::mig, i, static_cast<int>(mig)});
      }
      continue;
    }
    devices.push_back({fmt::format("gpu-{}", i), DeviceKind::whole, i});
    devices.push_back({fmt::format("gpu-{}-shared", i), DeviceKind::shared, i});
    if (const mig::GpuModel* model = mig_model(gpu)) {
      for (const mig::Profile& profile : model->profiles) {
        for (const int start : profile.starts) {
          devices.push_back({placement_name(i, profile, start), DeviceKind::mig_placement, i, -1,
                             &profile, start});
        }
      }
    }
  }
  return devices;
}

std::optional<PublishedDevice> find_published_device(const Inventory& inventory,
                                                     std::string_view name) {
  for (PublishedDevice& device : published_devices(inventory)) {
    if (device.name == name) return std::move(device);
  }
  return std::nullopt;
}

std::vector<json> pool_slices(const Inventory& inventory, const GpuHealth& health,
                              const SharedDefaults& defaults, const std::string& node,
                              std::int64_t generation) {
  json counter_sets = json::array();
  for (std::size_t index = 0; index < inventory.gpus.size(); ++index) {
    const GpuInfo& gpu = inventory.gpus[index];
    json counters = {{"memory", {{"value", memory_quantity(gpu.memory_bytes)}}}};
    if (const mig::GpuModel* model = mig_model(gpu)) {
      for (int slice = 0; slice < model->memory_slices; ++slice) {
        counters[slice_counter(slice)] = {{"value", "1"}};
      }
    }
    counter_sets.push_back(
        {{"name", counter_set(static_cast<int>(index))}, {"counters", counters}});
  }
  std::vector<json> device_specs;
  for (const PublishedDevice& device : published_devices(inventory)) {
    json spec = device_spec(inventory, device, defaults);
    const auto gpu = static_cast<std::size_t>(device.gpu);
    if (gpu < health.size() && !health[gpu].empty()) {
      json taint = {{"key", kUnhealthyTaint}, {"effect", "NoSchedule"}};
      if (const std::string value = taint_value(health[gpu]); !value.empty())
        taint["value"] = value;
      spec["taints"] = json::array({taint});
    }
    device_specs.push_back(std::move(spec));
  }
  std::vector<json> slices;
  auto slice = [&](const char* field, json items) {
    slices.push_back({{"driver", contract::kDraDriverName},
                      {"nodeName", node},
                      {"pool", {{"name", pool_name(node)}, {"generation", generation}}},
                      {field, std::move(items)}});
  };
  if (!counter_sets.empty()) slice("sharedCounters", counter_sets);
  for (std::size_t first = 0; first < device_specs.size(); first += kMostDevicesPerSlice) {
    const std::size_t last = std::min(device_specs.size(), first + kMostDevicesPerSlice);
    slice("devices", json(std::vector<json>(device_specs.begin() + static_cast<long>(first),
                                            device_specs.begin() + static_cast<long>(last))));
  }
  if (slices.empty()) slice("devices", json::array());  // a node without GPUs says so
  for (json& spec : slices) spec["pool"]["resourceSliceCount"] = slices.size();
  return slices;
}

}  // namespace tessera::dra
