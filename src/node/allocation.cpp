#include "node/allocation.h"

#include <fmt/core.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "base/strings.h"
#include "contract/variables.h"

namespace tessera::node {
namespace {

// Where NVIDIA's volume-mounts strategy lists devices, one empty file per device.
constexpr const char* kVolumeMountRoot = "/var/run/nvidia-container-devices";
constexpr const char* kCdiKind = "k8s.device-plugin.nvidia.com/gpu";

bool exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

std::string under_root(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  return (root.back() == '/' ? root.substr(0, root.size() - 1) : root) + path;
}

}  // namespace

std::vector<std::string> preferred_allocation(const Resource& resource,
                                              const std::vector<std::string>& available,
                                              const std::vector<std::string>& must_include,
                                              int size, ReplicaPolicy policy) {
  for (const auto* list : {&available, &must_include}) {
    for (const std::string& id : *list) {
      if (resource.find(id) == nullptr) {
        throw AllocationError(fmt::format("invalid allocation request for '{}': unknown device: {}",
                                          resource.name, id.substr(0, 100)));
      }
    }
  }
  std::vector<std::string> chosen = must_include;
  const std::set<std::string> required(must_include.begin(), must_include.end());
  std::vector<const AdvertisedDevice*> candidates;
  std::set<std::string> seen;
  for (const std::string& id : available) {
    if (required.count(id) == 0 && seen.insert(id).second) candidates.push_back(resource.find(id));
  }
  const int needed = size - static_cast<int>(chosen.size());
  if (needed <= 0) return chosen;
  if (static_cast<int>(candidates.size()) < needed) {
    throw AllocationError(fmt::format(
        "not enough available devices of '{}' to satisfy an allocation of {}: {} available",
        resource.name, size, candidates.size() + chosen.size()));
  }
  // Per GPU: how many of its devices are allocated now (the advertised ones not available).
  std::map<int, int> allocated;
  for (const AdvertisedDevice& device : resource.devices) ++allocated[device.gpu];
  for (const std::string& id : available) {
    if (required.count(id) == 0) --allocated[resource.find(id)->gpu];
  }
  const bool replicas =
      std::any_of(candidates.begin(), candidates.end(),
                  [](const AdvertisedDevice* device) { return device->replica >= 0; });
  if (replicas) {
    for (int taken = 0; taken < needed; ++taken) {
      // Distributed: the GPU with the fewest allocated; packed: the most. Ties: lower GPU.
      const auto best = std::min_element(
          candidates.begin(), candidates.end(),
          [&](const AdvertisedDevice* a, const AdvertisedDevice* b) {
            const int left = allocated[a->gpu], right = allocated[b->gpu];
            if (left != right)
              return policy == ReplicaPolicy::distributed ? left < right : left > right;
            return std::tie(a->gpu, a->replica) < std::tie(b->gpu, b->replica);
          });
      ++allocated[(*best)->gpu];
      chosen.push_back((*best)->id);
      candidates.erase(best);
    }
    return chosen;
  }
  // Whole GPUs: the NUMA node of those already required, else one that holds them all (the
  // fullest such node, to keep whole nodes free), else the nodes with most room first.
  std::map<int, std::vector<const AdvertisedDevice*>> by_node;
  for (const AdvertisedDevice* device : candidates) by_node[device->numa_node].push_back(device);
  int preferred = -2;
  for (const std::string& id : must_include) preferred = resource.find(id)->numa_node;
  std::vector<int> order;
  for (const auto& [node, devices] : by_node) order.push_back(node);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const bool a_preferred = a == preferred, b_preferred = b == preferred;
    if (a_preferred != b_preferred) return a_preferred;
    const int a_size = static_cast<int>(by_node[a].size()),
              b_size = static_cast<int>(by_node[b].size());
    const bool a_holds = a_size >= needed, b_holds = b_size >= needed;
    if (a_holds != b_holds) return a_holds;
    return a_holds ? a_size < b_size : a_size > b_size;
  });
  for (const int node : order) {
    for (const AdvertisedDevice* device : by_node[node]) {
      if (static_cast<int>(chosen.size()) == size) return chosen;
      chosen.push_back(device->id);
    }
  }
  return chosen;
}

std::vector<int> requested_gpus(const Resource& resource, const std::vector<std::string>& ids) {
  std::vector<int> gpus;
  for (const DeviceRef& device : requested_devices(resource, ids)) {
    if (std::find(gpus.begin(), gpus.end(), device.gpu) == gpus.end()) gpus.push_back(device.gpu);
  }
  return gpus;
}

std::vector<DeviceRef> requested_devices(const Resource& resource,
                                         const std::vector<std::string>& ids) {
  if (ids.empty()) {
    throw AllocationError(
        fmt::format("invalid allocation request for '{}': no devices", resource.name));
  }
  int replicas = 0;
  std::vector<DeviceRef> devices;
  for (const std::string& id : ids) {
    const AdvertisedDevice* device = resource.find(id);
    if (device == nullptr) {
      throw AllocationError(fmt::format("invalid allocation request for '{}': unknown device: {}",
                                        resource.name, id.substr(0, 100)));
    }
    replicas += device->replica >= 0;
    const DeviceRef ref{device->gpu, device->mig};
    if (std::find(devices.begin(), devices.end(), ref) == devices.end()) devices.push_back(ref);
  }
  if (resource.kind == ResourceKind::replicated && resource.fail_requests_greater_than_one &&
      replicas > 0 && ids.size() > 1) {
    throw AllocationError(fmt::format(
        "invalid request: maximum request size for shared resources is 1; found {}", ids.size()));
  }
  return devices;
}

namespace {

// The device node of a MIG capability ("gpu0/mig/gi1/access"): the driver names its minor in
// /proc/driver/nvidia/capabilities/<capability> ("DeviceFileMinor: 21"), and the node is
// /dev/nvidia-caps/nvidia-cap<minor>.
DeviceNodeSpec mig_capability_node(const std::string& root, const std::string& capability) {
  const std::string file = under_root(root, "/proc/driver/nvidia/capabilities/" + capability);
  std::string text;
  try {
    text = base::read_file_bounded(file, 4096);
  } catch (const ConfigError& unreadable) {
    throw AllocationError(fmt::format("MIG device node: {}", unreadable.what()));
  }
  const std::string key = "DeviceFileMinor:";
  const std::size_t at = text.find(key);
  unsigned minor = 0;
  std::size_t digits = 0;
  for (std::size_t i = at == std::string::npos ? text.size() : at + key.size();
       i < text.size() && digits < 8; ++i) {
    if (text[i] == ' ' && digits == 0) continue;
    if (text[i] < '0' || text[i] > '9') break;
    minor = minor * 10 + static_cast<unsigned>(text[i] - '0');
    ++digits;
  }
  if (digits == 0) {
    throw AllocationError(fmt::format("MIG device node: {} names no DeviceFileMinor", file));
  }
  const std::string path = fmt::format("/dev/nvidia-caps/nvidia-cap{}", minor);
  return {path, under_root(root, path), "rw"};
}

}  // namespace

std::vector<DeviceNodeSpec> device_nodes(const Inventory& inventory, const PluginConfig& config,
                                         const std::vector<DeviceRef>& devices) {
  std::vector<DeviceNodeSpec> nodes;
  const std::string& root = config.flags.nvidia_dev_root;
  auto add = [&nodes](DeviceNodeSpec node) {
    for (const DeviceNodeSpec& present : nodes) {
      if (present.container_path == node.container_path) return;
    }
    nodes.push_back(std::move(node));
  };
  for (const DeviceRef& device : devices) {
    const GpuInfo& gpu = inventory.gpus[static_cast<std::size_t>(device.gpu)];
    const std::string path = fmt::format("/dev/nvidia{}", gpu.index);
    add({path, under_root(root, path), "rw"});
    if (device.mig < 0) continue;
    // A MIG device also needs the capabilities of its GPU and compute instances.
    const MigDeviceInfo& mig = gpu.mig_devices[static_cast<std::size_t>(device.mig)];
    const std::string instance = fmt::format("gpu{}/mig/gi{}", gpu.index, mig.gpu_instance);
    add(mig_capability_node(root, instance + "/access"));
    add(mig_capability_node(root, fmt::format("{}/ci{}/access", instance, mig.compute_instance)));
  }
  add({"/dev/nvidiactl", under_root(root, "/dev/nvidiactl"), "rw"});
  // As NVIDIA's plugin: these only where the host has them.
  for (const char* optional : {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}) {
    if (exists(under_root(root, optional))) add({optional, under_root(root, optional), "rw"});
  }
  return nodes;
}

ContainerAllocation expose_gpus(const Inventory& inventory, const PluginConfig& config,
                                const std::vector<int>& gpus, const std::string& response_id) {
  std::vector<DeviceRef> devices;
  for (const int gpu : gpus) devices.push_back({gpu, -1});
  return expose_devices(inventory, config, devices, response_id);
}

ContainerAllocation expose_devices(const Inventory& inventory, const PluginConfig& config,
                                   const std::vector<DeviceRef>& devices,
                                   const std::string& response_id) {
  ContainerAllocation allocation;
  std::vector<std::string> ids;
  for (const DeviceRef& device : devices) {
    const GpuInfo& info = inventory.gpus[static_cast<std::size_t>(device.gpu)];
    const bool by_index = config.flags.device_id == DeviceIdStrategy::index;
    if (device.mig >= 0) {
      const MigDeviceInfo& mig = info.mig_devices[static_cast<std::size_t>(device.mig)];
      ids.push_back(by_index ? fmt::format("{}:{}", info.index, mig.index) : mig.uuid);
    } else {
      ids.push_back(by_index ? std::to_string(info.index) : info.uuid);
    }
  }
  const DeviceListStrategies& strategies = config.flags.device_list;
  if (strategies.envvar) allocation.envs[contract::kVisibleDevicesVariable] = base::join(ids, ",");
  if (strategies.volume_mounts) {
    allocation.envs[contract::kVisibleDevicesVariable] = kVolumeMountRoot;
    for (const std::string& id : ids) {
      allocation.mounts.push_back({std::string(kVolumeMountRoot) + "/" + id, "/dev/null", false});
    }
  }
  std::vector<std::string> qualified;
  for (const std::string& id : ids) qualified.push_back(fmt::format("{}={}", kCdiKind, id));
  if (strategies.cdi_annotations) {
    allocation
        .annotations[config.flags.cdi_annotation_prefix + "nvidia-device-plugin_" + response_id] =
        base::join(qualified, ",");
  }
  if (strategies.cdi_cri) allocation.cdi_devices = qualified;
  if (config.flags.pass_device_specs) allocation.devices = device_nodes(inventory, config, devices);
  if (config.flags.gds_enabled) allocation.envs["NVIDIA_GDS"] = "enabled";
  if (config.flags.mofed_enabled) allocation.envs["NVIDIA_MOFED"] = "enabled";
  return allocation;
}

std::string random_uuid() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  const std::uint64_t high = random(), low = random();
  return fmt::format("{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}", high >> 32, (high >> 16) & 0xffff,
                     high & 0xfff, (low >> 48 & 0x3fff) | 0x8000, low & 0xffffffffffffull);
}

}  // namespace tessera::node
