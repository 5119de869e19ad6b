// The node's pool of DRA devices: what Tessera publishes for each GPU, and the ResourceSlices
// (resource.k8s.io/v1) that carry them.
//
// Per GPU without MIG:
//   gpu-<i>          a whole GPU: NVIDIA's attribute names, capacity memory;
//   gpu-<i>-shared   the same GPU shared (allowMultipleAllocations): capacity memory and cores,
//                    each claim consuming what it asks within the request policies;
//   gpu-<i>-<profile>-<start>   each possible MIG placement of a MIG-capable GPU (type
//                    mig-placement): published so that the scheduler sees the counters they
//                    would take; no DeviceClass selects them until MIG devices are made on
//                    demand.
// Per GPU with MIG on: gpu-<i>-mig-<index> for each MIG device (type mig).
//
// Every device of a GPU consumes the GPU's counter set (KEP-4815): its memory, and for a
// MIG-capable GPU its memory slices, so the scheduler never allocates a whole GPU and a shared
// one or a MIG placement on the same silicon. Counter sets go in a slice of their own, devices
// in slices of at most 64, as the API asks. An unhealthy GPU's devices carry a NoSchedule taint.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mig/catalog.h"
#include "node/config.h"
#include "node/nvml.h"

namespace tessera::dra {

using node::GpuInfo;
using node::Inventory;
using node::MigDeviceInfo;

enum class DeviceKind { whole, shared, mig, mig_placement };

struct PublishedDevice {
  std::string name;
  DeviceKind kind = DeviceKind::whole;
  int gpu = -1;                           // inventory index
  int mig = -1;                           // GpuInfo::mig_devices index (mig)
  const mig::Profile* profile = nullptr;  // mig_placement
  int start = 0;                          // mig_placement: its first memory slice
};

// The shared GPU's request policies: the steps a claim may ask memory in, and what a claim that
// names no amount consumes where the node's config does not say.
inline constexpr std::uint64_t kSharedMemoryStepBytes = std::uint64_t{256} << 20;
inline constexpr std::uint64_t kSharedMemoryDefaultBytes = std::uint64_t{1} << 30;
inline constexpr int kSharedCoresDefault = 10;

// What a claim on a shared GPU consumes when it names no amount, from the node's config: its
// `sharing.slices` resource for nvidia.com/gpu, as a slice's defaults (memoryPerSlice, else the
// GPU's memory over its replicas; coresPerSlice). So one config states a slice for both ways of
// handing out GPUs.
struct SharedDefaults {
  std::uint64_t memory_per_slice = 0;  // 0: by replicas, else kSharedMemoryDefaultBytes
  int replicas = 0;
  int cores = 0;  // 0: kSharedCoresDefault
  bool operator==(const SharedDefaults&) const = default;

  // On `gpu`: a whole number of steps, at least one, at most the GPU's memory.
  std::uint64_t memory_on(const GpuInfo& gpu) const;
  int cores_or_default() const { return cores > 0 ? cores : kSharedCoresDefault; }
};
SharedDefaults shared_defaults(const node::PluginConfig& config);

std::vector<PublishedDevice> published_devices(const Inventory& inventory);
std::optional<PublishedDevice> find_published_device(const Inventory& inventory,
                                                     std::string_view name);

// The pool's name: the node's, as drivers conventionally name a node-local pool.
inline std::string pool_name(const std::string& node) {
  return node;
}

// Each GPU's reason for being unhealthy, "" when healthy (by inventory index).
using GpuHealth = std::vector<std::string>;

// The specs of the pool's slices at `generation`, in order (metadata is the publisher's).
std::vector<nlohmann::json> pool_slices(const Inventory& inventory, const GpuHealth& health,
                                        const SharedDefaults& defaults, const std::string& node,
                                        std::int64_t generation);

// A Kubernetes quantity for bytes, in MiB ("81559Mi"): exact for every size NVML reports.
std::string memory_quantity(std::uint64_t bytes);

}  // namespace tessera::dra
