#include "node/resources.h"

#include <fmt/core.h>

#include <algorithm>
#include <set>

namespace tessera::node {
namespace {

constexpr const char* kGpuResource = "nvidia.com/gpu";

// The GPUs a selection names, in the order of the inventory; throws naming what is not here.
std::vector<int> selected_gpus(const std::vector<int>& candidates, const Inventory& inventory,
                               const DeviceSelection& selection, const std::string& where) {
  switch (selection.kind) {
    case DeviceSelection::Kind::all:
      return candidates;
    case DeviceSelection::Kind::count:
      return std::vector<int>(
          candidates.begin(),
          candidates.begin() +
              std::min<std::size_t>(candidates.size(), static_cast<std::size_t>(selection.count)));
    case DeviceSelection::Kind::list:
      break;
  }
  std::set<int> chosen;
  for (const std::string& ref : selection.refs) {
    int found = -1;
    for (const int gpu : candidates) {
      const GpuInfo& info = inventory.gpus[static_cast<std::size_t>(gpu)];
      if (ref == std::to_string(info.index) || ref == info.uuid) found = gpu;
    }
    if (found < 0) {
      const bool mig = ref.find(':') != std::string::npos || ref.rfind("MIG-", 0) == 0;
      throw ConfigError(fmt::format(
          "{}: devices: {} {} on this node", where, ref,
          mig ? "names a MIG device, and none is served here" : "names no GPU shared here"));
    }
    chosen.insert(found);
  }
  return {chosen.begin(), chosen.end()};
}

// NVIDIA's MIG strategies, as far as GPUs without MIG devices go: `none` and `mixed` serve
// every GPU whose MIG mode is off as nvidia.com/gpu; `single` needs every GPU alike.
std::vector<int> whole_gpus(const Inventory& inventory, const PluginConfig& config,
                            std::vector<std::string>& notes) {
  std::vector<int> gpus;
  const auto enabled = std::count_if(inventory.gpus.begin(), inventory.gpus.end(),
                                     [](const GpuInfo& gpu) { return gpu.mig_enabled; });
  const std::string where = config.origin + ": flags.migStrategy";
  switch (config.flags.mig_strategy) {
    case MigStrategy::none:
      for (const GpuInfo& gpu : inventory.gpus) gpus.push_back(static_cast<int>(gpu.index));
      return gpus;
    case MigStrategy::single:
      if (enabled > 0 && enabled < static_cast<long>(inventory.gpus.size())) {
        throw ConfigError(fmt::format(
            "{}: single: all devices on the node must be configured with the same migEnabled "
            "value",
            where));
      }
      if (enabled > 0) {
        for (const GpuInfo& gpu : inventory.gpus) {
          throw ConfigError(fmt::format(
              "{}: single: device {} has no MIG devices configured (tessera node does not serve "
              "MIG devices yet)",
              where, gpu.index));
        }
      }
      break;
    case MigStrategy::mixed:
      break;
  }
  for (const GpuInfo& gpu : inventory.gpus) {
    if (gpu.mig_enabled) {
      notes.push_back(
          fmt::format("GPU {} has MIG enabled and no MIG device is served yet; "
                      "it is not advertised",
                      gpu.index));
      continue;
    }
    gpus.push_back(static_cast<int>(gpu.index));
  }
  return gpus;
}

Resource& resource_named(ResourceMap& map, const std::string& name, ResourceKind kind) {
  for (Resource& resource : map.resources) {
    if (resource.name == name) return resource;
  }
  map.resources.push_back(Resource{name, kind, {}, 1, false, 0, 0});
  return map.resources.back();
}

void add_shared(ResourceMap& map, const Inventory& inventory, std::vector<int>& unshared,
                const SharedResources& section, const SharedResource& shared, ResourceKind kind,
                const std::string& where) {
  if (shared.name != kGpuResource) {
    map.notes.push_back(
        fmt::format("{}: {} matches no device on this node; skipped", where, shared.name));
    return;  // MIG resources on a node without MIG devices, as NVIDIA's plugin skips them
  }
  const std::vector<int> gpus = selected_gpus(unshared, inventory, shared.devices, where);
  if (gpus.empty()) return;
  std::string name = shared.rename;
  if (name.empty() && section.rename_by_default) name = shared.name + ".shared";
  if (name.empty()) name = shared.name;
  if (map.find(name) != nullptr && map.find(name)->kind != kind) {
    throw ConfigError(fmt::format("{}: {} would be served both whole and shared", where, name));
  }
  Resource& resource = resource_named(map, name, kind);
  resource.replicas = shared.replicas;
  resource.fail_requests_greater_than_one = section.fail_requests_greater_than_one;
  resource.memory_per_slice = shared.memory_per_slice;
  resource.cores_per_slice = shared.cores_per_slice;
  for (const int gpu : gpus) {
    const GpuInfo& info = inventory.gpus[static_cast<std::size_t>(gpu)];
    if (kind == ResourceKind::slices && shared.memory_per_slice > info.memory_bytes) {
      throw ConfigError(fmt::format("{}: memoryPerSlice is more than GPU {} has ({} MiB)", where,
                                    info.index, info.memory_bytes >> 20));
    }
    for (int replica = 0; replica < shared.replicas; ++replica) {
      const std::string id = fmt::format("{}::{}", info.uuid, replica);
      if (id.size() > kMostDeviceIdLength) {
        throw ConfigError(fmt::format("{}: device ID {} is longer than the kubelet takes ({})",
                                      where, id, kMostDeviceIdLength));
      }
      resource.devices.push_back(AdvertisedDevice{id, gpu, replica, info.numa_node});
    }
    unshared.erase(std::remove(unshared.begin(), unshared.end(), gpu), unshared.end());
  }
}

}  // namespace

const AdvertisedDevice* Resource::find(const std::string& id) const {
  for (const AdvertisedDevice& device : devices) {
    if (device.id == id) return &device;
  }
  return nullptr;
}

std::string Resource::signature() const {
  std::string text = fmt::format("{}|{}|{}|{}|{}|{}", name, static_cast<int>(kind), replicas,
                                 fail_requests_greater_than_one, memory_per_slice, cores_per_slice);
  for (const AdvertisedDevice& device : devices) {
    text += fmt::format("|{}@{}", device.id, device.numa_node);
  }
  return text;
}

const Resource* ResourceMap::find(const std::string& name) const {
  for (const Resource& resource : resources) {
    if (resource.name == name) return &resource;
  }
  return nullptr;
}

std::string base_device_id(const std::string& id) {
  return id.substr(0, id.find("::"));
}

ResourceMap build_resource_map(const Inventory& inventory, const PluginConfig& config) {
  if (config.strategy() == SharingStrategy::mps) {
    throw ConfigError(fmt::format(
        "{}: sharing.mps: this tessera node does not run MPS control daemons yet; share with "
        "sharing.timeSlicing or sharing.slices for now",
        config.origin));
  }
  ResourceMap map;
  std::vector<int> unshared = whole_gpus(inventory, config, map.notes);
  const SharedResources& replicated = config.replicated();
  const char* section = config.mps.present ? "sharing.mps" : "sharing.timeSlicing";
  for (std::size_t i = 0; i < replicated.resources.size(); ++i) {
    add_shared(map, inventory, unshared, replicated, replicated.resources[i],
               ResourceKind::replicated,
               fmt::format("{}: {}.resources[{}]", config.origin, section, i));
  }
  for (std::size_t i = 0; i < config.slices.resources.size(); ++i) {
    add_shared(map, inventory, unshared, config.slices, config.slices.resources[i],
               ResourceKind::slices,
               fmt::format("{}: sharing.slices.resources[{}]", config.origin, i));
  }
  // What no sharing took stays whole under nvidia.com/gpu, as NVIDIA's plugin leaves it: beside
  // the replicas in one resource when these are not renamed.
  if (!unshared.empty()) {
    Resource& whole = resource_named(map, kGpuResource, ResourceKind::whole);
    for (const int gpu : unshared) {
      const GpuInfo& info = inventory.gpus[static_cast<std::size_t>(gpu)];
      whole.devices.push_back(AdvertisedDevice{info.uuid, gpu, -1, info.numa_node});
    }
  }
  std::sort(map.resources.begin(), map.resources.end(),
            [](const Resource& a, const Resource& b) { return a.name < b.name; });
  return map;
}

}  // namespace tessera::node
