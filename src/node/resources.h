// The resource map: from the GPUs a node has and its config, which Kubernetes resources the
// node agent advertises and with which device IDs, exactly as NVIDIA's plugin makes them:
// whole GPUs under nvidia.com/gpu with their UUIDs; time-slicing and MPS replicas as
// <uuid>::<i>, under nvidia.com/gpu or, renamed, nvidia.com/gpu.shared; and Tessera's slices,
// which advertise nvidia.com/gpu as HAMi does (a count of slices per GPU), their limits set
// from the pod the kubelet gave them to; with `gpushare`, the same GPUs' memory as gpushare's
// aliyun.com/gpu-mem, one device per GiB (<uuid>-_-<i>).
#pragma once

#include <string>
#include <vector>

#include "node/config.h"
#include "node/nvml.h"

namespace tessera::node {

// gpushare: memory units of sliced GPUs (aliyun.com/gpu-mem), limited as slices are.
enum class ResourceKind { whole, replicated, slices, gpushare };

// Whether a resource's containers are given the hook, a ledger and their limits.
inline bool limited_kind(ResourceKind kind) {
  return kind == ResourceKind::slices || kind == ResourceKind::gpushare;
}

struct AdvertisedDevice {
  std::string id;    // what the kubelet sees
  int gpu = -1;      // the inventory's index of the GPU behind it
  int replica = -1;  // -1 for a whole GPU (or MIG device); a gpushare device's GiB
  int numa_node = -1;
  int mig = -1;  // the GPU's MIG device (GpuInfo::mig_devices) it stands for; -1: the GPU
};

struct Resource {
  std::string name;  // nvidia.com/gpu, nvidia.com/gpu.shared, ...
  ResourceKind kind = ResourceKind::whole;
  std::vector<AdvertisedDevice> devices;
  int replicas = 1;  // per GPU, for replicated and slices
  bool fail_requests_greater_than_one = false;
  std::uint64_t memory_per_slice = 0;  // slices: bytes; 0: the GPU's memory / replicas
  int cores_per_slice = 0;             // slices: percent; 0: no cap
  bool mps = false;                    // replicas served through an MPS control daemon

  const AdvertisedDevice* find(const std::string& id) const;
  // Everything that, changed, needs the kubelet to hear of the resource anew.
  std::string signature() const;
};

struct ResourceMap {
  std::vector<Resource> resources;
  std::vector<std::string> notes;  // what was skipped, and why
  const Resource* find(const std::string& name) const;
};

// MIG devices are served per the config's migStrategy: `none` ignores them, `single` serves
// them as nvidia.com/gpu, `mixed` as nvidia.com/mig-<profile> ("+me" as ".me"); time-slicing
// shares them under those names as NVIDIA's plugin does.
// Throws ConfigError naming the config's file and field, with NVIDIA's message where NVIDIA
// refuses the same thing at start (MIG strategies, devices a selection names that are not here).
ResourceMap build_resource_map(const Inventory& inventory, const PluginConfig& config);

// The part of a device ID before "::": the GPU's own ID.
std::string base_device_id(const std::string& id);
// The kubelet's limit on a device ID.
inline constexpr std::size_t kMostDeviceIdLength = 63;

}  // namespace tessera::node
