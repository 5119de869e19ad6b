// The MIG profile catalog of a GPU as its driver reports it (NVML), and how it differs from the
// built-in one. Takes the two NVML calls it needs as function pointers, so that the node agent
// (through its loader) and the GPU check (with nothing but libc) read it the same way.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cuda_abi/nvml_abi.h"
#include "mig/catalog.h"

namespace tessera::mig {

struct NvmlProfileCalls {
  abi::PFN_nvmlDeviceGetGpuInstanceProfileInfoV profile_info = nullptr;
  abi::PFN_nvmlDeviceGetGpuInstancePossiblePlacements_v2 placements = nullptr;
};

struct NvmlCatalog {
  GpuModel model;                  // the profiles the GPU reports; key and names: the GPU's name
  std::vector<std::string> notes;  // per profile index, what NVML answered when it gave none
};

// Asks for every GPU instance profile NVML knows (NVML_GPU_INSTANCE_PROFILE_*) and its
// placements. Profiles the GPU lacks (NOT_SUPPORTED, INVALID_ARGUMENT) are left out; other
// failures are noted. `error_text` names an NVML return code.
NvmlCatalog read_nvml_catalog(const NvmlProfileCalls& calls, abi::nvmlDevice_t device,
                              const std::string& gpu_name,
                              const std::function<std::string(abi::nvmlReturn_t)>& error_text);

// Where two catalogs of one model disagree: a profile one has and the other lacks, or a field
// (ID, slices, most, memory, SMs, starts) that differs. Empty when they agree.
std::vector<std::string> catalog_differences(const GpuModel& expected, const GpuModel& reported);

}  // namespace tessera::mig
