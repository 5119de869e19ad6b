// What the device plugin answers the kubelet, in plain terms (the gRPC server converts):
// which devices it prefers for a container, and what a container given devices gets
// (environment, mounts, device nodes, CDI devices and annotations), per NVIDIA's
// deviceListStrategy, deviceIDStrategy and passDeviceSpecs.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "node/config.h"
#include "node/nvml.h"
#include "node/resources.h"

namespace tessera::node {

// Refused requests: the message is what the kubelet shows on the pod.
struct AllocationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct MountSpec {
  std::string container_path, host_path;
  bool read_only = false;
};
struct DeviceNodeSpec {
  std::string container_path, host_path, permissions;
};

struct ContainerAllocation {
  std::map<std::string, std::string> envs;
  std::vector<MountSpec> mounts;
  std::vector<DeviceNodeSpec> devices;
  std::map<std::string, std::string> annotations;
  std::vector<std::string> cdi_devices;
};

// Replicas of several GPUs: spread over them (fewest allocated first) or packed onto the
// GPU with the most already allocated.
enum class ReplicaPolicy { distributed, packed };

// The devices the plugin would give a container: must_include first, then `size` in all
// from `available`. Replicas follow `policy`; whole GPUs come from one NUMA node where one
// can hold them. Throws AllocationError when the request cannot be met or names unknown IDs.
std::vector<std::string> preferred_allocation(const Resource& resource,
                                              const std::vector<std::string>& available,
                                              const std::vector<std::string>& must_include,
                                              int size, ReplicaPolicy policy);

// A device a container gets: a whole GPU (mig -1) or one of its MIG devices.
struct DeviceRef {
  int gpu = -1;  // inventory index
  int mig = -1;  // GpuInfo::mig_devices index
  bool operator==(const DeviceRef&) const = default;
};

// The devices (de-duplicated, in order) a container's device IDs stand for, with NVIDIA's
// checks: unknown IDs and, with failRequestsGreaterThanOne, more than one replica.
std::vector<DeviceRef> requested_devices(const Resource& resource,
                                         const std::vector<std::string>& ids);
// The same, as the GPUs behind them.
std::vector<int> requested_gpus(const Resource& resource, const std::vector<std::string>& ids);

// The container's view of `devices` for the container runtime: GPU UUIDs (or indices) and MIG
// device UUIDs (or <gpu>:<mig> indices) per deviceIDStrategy. `response_id` names the CDI
// annotation (NVIDIA uses a fresh UUID per response).
ContainerAllocation expose_devices(const Inventory& inventory, const PluginConfig& config,
                                   const std::vector<DeviceRef>& devices,
                                   const std::string& response_id);
// expose_devices for whole GPUs.
ContainerAllocation expose_gpus(const Inventory& inventory, const PluginConfig& config,
                                const std::vector<int>& gpus, const std::string& response_id);

// The device nodes a container with `devices` needs, as passDeviceSpecs gives them: each
// GPU's, a MIG device's instance capabilities (/dev/nvidia-caps), nvidiactl and UVM's.
// Throws AllocationError when a MIG capability's minor cannot be read.
std::vector<DeviceNodeSpec> device_nodes(const Inventory& inventory, const PluginConfig& config,
                                         const std::vector<DeviceRef>& devices);

// A random UUID (version 4), for CDI annotation keys.
std::string random_uuid();

}  // namespace tessera::node
