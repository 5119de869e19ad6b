// What the node agent's in-process tests share: machines as NVML would describe them, the
// example configs, and the resources a map serves.
#pragma once

#include <fmt/core.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "contract/annotations.h"
#include "contract/host_layout.h"
#include "contract/layout.h"
#include "contract/variables.h"
#include "extender/cluster_objects.h"
#include "ledger/ledger.h"
#include "node/allocation.h"
#include "node/config.h"
#include "node/container_grants.h"
#include "node/health.h"
#include "node/labels.h"
#include "node/mps.h"
#include "node/resources.h"
#include "support.h"

namespace tessera::test {

using namespace tessera::node;
namespace fs = std::filesystem;

inline std::string example(const std::string& name) {
  return std::string(TESSERA_SOURCE_DIR) + "/examples/node-configs/" + name;
}

// A machine as NVML would describe it: `count` GPUs of a model, UUIDs as the simulated GPU
// gives them.
inline Inventory machine(int count, const std::string& name = "NVIDIA A100-SXM4-40GB",
                         int numa_every = 0) {
  Inventory inventory;
  inventory.driver_version = "580.65.06";
  inventory.cuda_major = 13;
  for (int i = 0; i < count; ++i) {
    GpuInfo gpu;
    gpu.index = static_cast<unsigned>(i);
    gpu.uuid = simulated_gpu_uuid(i);
    gpu.name = name;
    gpu.memory_bytes = 40960ull << 20;
    gpu.cc_major = name.find("T4") != std::string::npos ? 7 : 8;
    gpu.cc_minor = name.find("T4") != std::string::npos ? 5 : 0;
    gpu.mig_capable = gpu.cc_major >= 8;
    gpu.numa_node = numa_every > 0 ? i / numa_every : -1;
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

// NVIDIA's replica IDs: each GPU's UUID, then ::0 to ::replicas-1.
inline std::set<std::string> simulated_replica_ids(const std::vector<int>& gpus, int replicas) {
  std::set<std::string> ids;
  for (const int gpu : gpus) {
    for (int i = 0; i < replicas; ++i)
      ids.insert(simulated_gpu_uuid(gpu) + "::" + std::to_string(i));
  }
  return ids;
}

inline std::map<std::string, std::set<std::string>> resources_of(const ResourceMap& map) {
  std::map<std::string, std::set<std::string>> out;
  for (const Resource& resource : map.resources) {
    for (const AdvertisedDevice& device : resource.devices) out[resource.name].insert(device.id);
  }
  return out;
}

// MIG devices as the simulated GPU names them, on GPU `gpu`: its instances' profiles in order.
inline void give_mig_devices(GpuInfo& gpu, const std::vector<std::string>& profiles) {
  gpu.mig_enabled = true;
  for (const std::string& profile : profiles) {
    const int index = static_cast<int>(gpu.mig_devices.size());
    gpu.mig_devices.push_back(
        {fmt::format("MIG-7e55e7a0-{:04x}-4{:03x}-8000-00000000000{}", gpu.index, index + 1, index),
         profile, index, static_cast<unsigned>(index + 1), 0, -1,
         (profile.rfind("3g", 0) == 0 ? 19968ull : 4864ull) << 20,
         profile.rfind("3g", 0) == 0 ? 42 : 14});
  }
}

}  // namespace tessera::test
