// Every resource in a pod's limits that Tessera reads, whether a node advertises it to the
// kubelet, and how many of it a pod may ask for. kube::pod_from_json reads a pod through this
// table, and the scheduler's configuration (deploy/) must name each as a managed resource of
// the extender, ignored by kube-scheduler where no node advertises it: a test derives that list
// from this one, so a resource read here cannot be left out there.
#pragma once

#include <cstdint>
#include <string_view>

namespace tessera::contract {

enum class PodResource {
  gpus,                // nvidia.com/gpu: GPUs, or slices of GPUs (HAMi)
  gpu_memory_mib,      // nvidia.com/gpumem: MiB of each GPU (HAMi)
  gpu_memory_percent,  // nvidia.com/gpumem-percentage: percent of each GPU's memory (HAMi)
  gpu_cores,           // nvidia.com/gpucores: percent of each GPU's time (HAMi)
  priority,            // nvidia.com/priority: 0 high, 1 low (HAMi)
  gpushare_memory,     // aliyun.com/gpu-mem: GiB of one GPU (gpushare)
};

struct PodResourceName {
  PodResource resource;
  const char* name;
  bool advertised;  // a node advertises it to the kubelet (else only the extender counts it)
};

inline constexpr PodResourceName kPodResources[] = {
    {PodResource::gpus, "nvidia.com/gpu", true},
    {PodResource::gpu_memory_mib, "nvidia.com/gpumem", false},
    {PodResource::gpu_memory_percent, "nvidia.com/gpumem-percentage", false},
    {PodResource::gpu_cores, "nvidia.com/gpucores", false},
    {PodResource::priority, "nvidia.com/priority", false},
    {PodResource::gpushare_memory, "aliyun.com/gpu-mem", true},
};

constexpr const char* resource_name(PodResource resource) {
  for (const PodResourceName& entry : kPodResources) {
    if (entry.resource == resource) return entry.name;
  }
  return "";
}

// MIG devices, one resource per profile, as NVIDIA's mixed strategy advertises them:
// nvidia.com/mig-<profile>, "+me" written ".me".
inline constexpr std::string_view kMigResourcePrefix = "nvidia.com/mig-";

// HAMi's default for a container that asks for no nvidia.com/priority: low (HAMi-core's
// CUDA_TASK_PRIORITY defaults to 1).
inline constexpr int kHamiDefaultPriority = 1;

// gpushare's unit: aliyun.com/gpu-mem counts GiB, one device each.
inline constexpr std::uint64_t kGpushareUnitBytes = std::uint64_t{1} << 30;
// gpushare's device IDs: <GPU UUID>-_-<unit>.
inline constexpr std::string_view kGpushareIdSeparator = "-_-";

}  // namespace tessera::contract
