// The GPUs this machine has, as NVML reports them: NVIDIA's NVML where a driver is
// installed, the simulated one otherwise. NVML numbers GPUs physically and ignores
// CUDA_VISIBLE_DEVICES, as `tessera run --device N` does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/environment.h"

namespace tessera::cli {

struct GpuInfo {
  unsigned index = 0;
  std::string name, uuid;
  std::uint64_t memory_total = 0, memory_used = 0;
};

// Throws std::runtime_error if NVML cannot be loaded or cannot describe a GPU.
std::vector<GpuInfo> list_gpus(const Installation& installation, bool simulated);

}  // namespace tessera::cli
