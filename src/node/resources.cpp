#include "node/resources.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <set>

#include "contract/pod_resources.h"
#include "mig/catalog.h"

namespace tessera::node {
namespace {

constexpr const char* kGpuResource = "nvidia.com/gpu";

// A device before sharing: a whole GPU or a MIG device, under the resource that serves it.
struct Unit {
  std::string id;  // its UUID
  int gpu = -1;
  int mig = -1;
  std::string index_name;  // "3", or "3:1" for a MIG device
  int numa_node = -1;
  std::uint64_t memory_bytes = 0;
};
using Units = std::map<std::string, std::vector<Unit>>;  // by the resource they would have

// The units a selection names, in order; throws naming what is not here.
std::vector<Unit> selected_units(const std::vector<Unit>& candidates,
                                 const DeviceSelection& selection, const std::string& where) {
  switch (selection.kind) {
    case DeviceSelection::Kind::all:
      return candidates;
    case DeviceSelection::Kind::count:
      return std::vector<Unit>(
          candidates.begin(),
          candidates.begin() +
              std::min<std::size_t>(candidates.size(), static_cast<std::size_t>(selection.count)));
    case DeviceSelection::Kind::list:
      break;
  }
  std::set<std::size_t> chosen;
  for (const std::string& ref : selection.refs) {
    const auto found = std::find_if(candidates.begin(), candidates.end(), [&](const Unit& unit) {
      return ref == unit.index_name || ref == unit.id;
    });
    if (found == candidates.end()) {
      const bool mig = ref.find(':') != std::string::npos || ref.rfind("MIG-", 0) == 0;
      throw ConfigError(
          fmt::format("{}: devices: {} {} on this node", where, ref,
                      mig ? "names no MIG device shared here" : "names no GPU shared here"));
    }
    chosen.insert(static_cast<std::size_t>(found - candidates.begin()));
  }
  std::vector<Unit> units;
  for (const std::size_t at : chosen) units.push_back(candidates[at]);
  return units;
}

Unit whole_unit(const GpuInfo& gpu) {
  return {
      gpu.uuid,        static_cast<int>(gpu.index), -1, std::to_string(gpu.index), gpu.numa_node,
      gpu.memory_bytes};
}

Unit mig_unit(const GpuInfo& gpu, const MigDeviceInfo& device) {
  return {device.uuid,   static_cast<int>(gpu.index),
          device.index,  fmt::format("{}:{}", gpu.index, device.index),
          gpu.numa_node, device.memory_bytes};
}

// NVIDIA's MIG strategies: which units each resource name starts with. `none` serves every
// GPU whole; `single` serves MIG devices as nvidia.com/gpu when every GPU has MIG on with one
// profile; `mixed` serves GPUs with MIG off whole and MIG devices by profile.
Units units_by_strategy(const Inventory& inventory, const PluginConfig& config) {
  Units units;
  const auto enabled = std::count_if(inventory.gpus.begin(), inventory.gpus.end(),
                                     [](const GpuInfo& gpu) { return gpu.mig_enabled; });
  const std::string where = config.origin + ": flags.migStrategy";
  switch (config.flags.mig_strategy) {
    case MigStrategy::none:
      for (const GpuInfo& gpu : inventory.gpus) units[kGpuResource].push_back(whole_unit(gpu));
      return units;
    case MigStrategy::single: {
      if (enabled == 0) {
        for (const GpuInfo& gpu : inventory.gpus) units[kGpuResource].push_back(whole_unit(gpu));
        return units;
      }
      if (enabled < static_cast<long>(inventory.gpus.size())) {
        throw ConfigError(fmt::format(
            "{}: single: all devices on the node must be configured with the same migEnabled "
            "value",
            where));
      }
      std::set<std::string> profiles;
      for (const GpuInfo& gpu : inventory.gpus) {
        if (gpu.mig_devices.empty()) {
          throw ConfigError(
              fmt::format("{}: single: device {} has no MIG devices configured", where, gpu.index));
        }
        for (const MigDeviceInfo& device : gpu.mig_devices) {
          profiles.insert(device.profile);
          units[kGpuResource].push_back(mig_unit(gpu, device));
        }
      }
      if (profiles.size() > 1) {
        throw ConfigError(
            fmt::format("{}: single: more than one MIG device type present on node", where));
      }
      return units;
    }
    case MigStrategy::mixed:
      for (const GpuInfo& gpu : inventory.gpus) {
        if (!gpu.mig_enabled) {
          units[kGpuResource].push_back(whole_unit(gpu));
          continue;
        }
        for (const MigDeviceInfo& device : gpu.mig_devices) {
          units["nvidia.com/mig-" + mig::resource_profile_name(device.profile)].push_back(
              mig_unit(gpu, device));
        }
      }
      return units;
  }
  return units;
}

Resource& resource_named(ResourceMap& map, const std::string& name, ResourceKind kind) {
  for (Resource& resource : map.resources) {
    if (resource.name == name) return resource;
  }
  map.resources.push_back(Resource{name, kind, {}, 1, false, 0, 0});
  return map.resources.back();
}

// MPS serves at most this many clients per GPU (Volta and later).
constexpr int kMostMpsReplicas = 48;

void add_shared(ResourceMap& map, Units& units, const SharedResources& section,
                const SharedResource& shared, ResourceKind kind, bool mps,
                const std::string& where) {
  const auto pool = units.find(shared.name);
  if (pool == units.end()) {
    map.notes.push_back(
        fmt::format("{}: {} matches no device on this node; skipped", where, shared.name));
    return;  // MIG resources on a node without MIG devices, as NVIDIA's plugin skips them
  }
  const std::vector<Unit> chosen = selected_units(pool->second, shared.devices, where);
  if (chosen.empty()) return;
  std::string name = shared.rename;
  if (name.empty() && section.rename_by_default) name = shared.name + ".shared";
  if (name.empty()) name = shared.name;
  if (map.find(name) != nullptr && map.find(name)->kind != kind) {
    throw ConfigError(fmt::format("{}: {} would be served both whole and shared", where, name));
  }
  if (mps && shared.replicas > kMostMpsReplicas) {
    throw ConfigError(fmt::format("{}: replicas: {} is more clients than MPS serves on a GPU ({})",
                                  where, shared.replicas, kMostMpsReplicas));
  }
  Resource& resource = resource_named(map, name, kind);
  resource.mps = mps;
  resource.replicas = shared.replicas;
  resource.fail_requests_greater_than_one = section.fail_requests_greater_than_one;
  resource.memory_per_slice = shared.memory_per_slice;
  resource.cores_per_slice = shared.cores_per_slice;
  for (const Unit& unit : chosen) {
    if (mps && unit.mig >= 0) {
      throw ConfigError(fmt::format("{}: {}: sharing using MPS is not supported for MIG devices",
                                    where, unit.id));
    }
    if (kind == ResourceKind::slices && unit.mig >= 0) {
      throw ConfigError(fmt::format(
          "{}: {}: slices of MIG devices are not served; share MIG devices with timeSlicing", where,
          unit.id));
    }
    if (kind == ResourceKind::slices && shared.memory_per_slice > unit.memory_bytes) {
      throw ConfigError(fmt::format("{}: memoryPerSlice is more than GPU {} has ({} MiB)", where,
                                    unit.index_name, unit.memory_bytes >> 20));
    }
    for (int replica = 0; replica < shared.replicas; ++replica) {
      const std::string id = fmt::format("{}::{}", unit.id, replica);
      if (id.size() > kMostDeviceIdLength) {
        throw ConfigError(fmt::format("{}: device ID {} is longer than the kubelet takes ({})",
                                      where, id, kMostDeviceIdLength));
      }
      resource.devices.push_back(AdvertisedDevice{id, unit.gpu, replica, unit.numa_node, unit.mig});
    }
    std::erase_if(pool->second, [&](const Unit& left) { return left.id == unit.id; });
  }
}

// gpushare's aliyun.com/gpu-mem: every sliced GPU's memory, one device per GiB, as gpushare's
// device plugin advertises it.
void add_gpushare(ResourceMap& map, const Inventory& inventory, const PluginConfig& config) {
  const std::string name = contract::resource_name(contract::PodResource::gpushare_memory);
  std::set<int> sliced;
  for (const Resource& resource : map.resources) {
    if (resource.kind != ResourceKind::slices) continue;
    for (const AdvertisedDevice& device : resource.devices) {
      if (device.replica >= 0) sliced.insert(device.gpu);
    }
  }
  if (sliced.empty()) {
    map.notes.push_back(
        fmt::format("{}: sharing.slices.gpushare: no GPU is sliced here; {} is "
                    "not served",
                    config.origin, name));
    return;
  }
  Resource& units = resource_named(map, name, ResourceKind::gpushare);
  units.replicas = 0;  // per GPU, as its memory has GiB
  for (const int gpu : sliced) {
    const GpuInfo& info = inventory.gpus[static_cast<std::size_t>(gpu)];
    const auto gib = static_cast<int>(info.memory_bytes / contract::kGpushareUnitBytes);
    for (int unit = 0; unit < gib; ++unit) {
      units.devices.push_back(
          AdvertisedDevice{fmt::format("{}{}{}", info.uuid, contract::kGpushareIdSeparator, unit),
                           gpu, unit, info.numa_node, -1});
    }
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
  std::string text =
      fmt::format("{}|{}|{}|{}|{}|{}|{}", name, static_cast<int>(kind), replicas,
                  fail_requests_greater_than_one, memory_per_slice, cores_per_slice, mps);
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
  const std::size_t unit = id.find(contract::kGpushareIdSeparator);
  return id.substr(0, unit != std::string::npos ? unit : id.find("::"));
}

ResourceMap build_resource_map(const Inventory& inventory, const PluginConfig& config) {
  ResourceMap map;
  Units units = units_by_strategy(inventory, config);
  for (const GpuInfo& gpu : inventory.gpus) {
    if (gpu.mig_enabled && config.flags.mig_strategy == MigStrategy::none) {
      map.notes.push_back(fmt::format(
          "GPU {} has MIG on and migStrategy is none: served whole, as NVIDIA's plugin does",
          gpu.index));
    }
    if (gpu.mig_enabled && config.flags.mig_strategy == MigStrategy::mixed &&
        gpu.mig_devices.empty()) {
      map.notes.push_back(fmt::format("GPU {} has MIG on and no MIG devices", gpu.index));
    }
  }
  const SharedResources& replicated = config.replicated();
  const char* section = config.mps.present ? "sharing.mps" : "sharing.timeSlicing";
  for (std::size_t i = 0; i < replicated.resources.size(); ++i) {
    add_shared(map, units, replicated, replicated.resources[i], ResourceKind::replicated,
               config.mps.present, fmt::format("{}: {}.resources[{}]", config.origin, section, i));
  }
  for (std::size_t i = 0; i < config.slices.resources.size(); ++i) {
    add_shared(map, units, config.slices, config.slices.resources[i], ResourceKind::slices, false,
               fmt::format("{}: sharing.slices.resources[{}]", config.origin, i));
  }
  if (config.slices.gpushare) add_gpushare(map, inventory, config);
  // What no sharing took stays whole under its own name, as NVIDIA's plugin leaves it: beside
  // the replicas in one resource when these are not renamed.
  for (const auto& [name, left] : units) {
    if (left.empty()) continue;
    Resource& whole = resource_named(map, name, ResourceKind::whole);
    for (const Unit& unit : left) {
      whole.devices.push_back(AdvertisedDevice{unit.id, unit.gpu, -1, unit.numa_node, unit.mig});
    }
  }
  std::sort(map.resources.begin(), map.resources.end(),
            [](const Resource& a, const Resource& b) { return a.name < b.name; });
  return map;
}

}  // namespace tessera::node
