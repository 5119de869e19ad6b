#include "cli/gpus.h"

#include <dlfcn.h>
#include <fmt/core.h>

#include <stdexcept>

#include "cuda_abi/nvml_abi.h"

namespace tessera::cli {
namespace {

using namespace tessera::abi;

template <typename Function>
Function resolve(void* library, const char* name) {
  auto* function = reinterpret_cast<Function>(dlsym(library, name));
  if (function == nullptr) throw std::runtime_error(fmt::format("NVML lacks {}", name));
  return function;
}

}  // namespace

std::vector<GpuInfo> list_gpus(const Installation& installation, bool simulated) {
  const std::string library =
      simulated ? installation.simulator_dir + "/libnvidia-ml.so.1" : "libnvidia-ml.so.1";
  void* nvml = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (nvml == nullptr) {
    throw std::runtime_error(fmt::format("cannot load {}: {}", library, dlerror()));
  }
  auto init = resolve<PFN_nvmlInit_v2>(nvml, "nvmlInit_v2");
  auto count = resolve<PFN_nvmlDeviceGetCount_v2>(nvml, "nvmlDeviceGetCount_v2");
  auto by_index = resolve<PFN_nvmlDeviceGetHandleByIndex_v2>(nvml, "nvmlDeviceGetHandleByIndex_v2");
  auto name_of = resolve<PFN_nvmlDeviceGetName>(nvml, "nvmlDeviceGetName");
  auto uuid_of = resolve<PFN_nvmlDeviceGetUUID>(nvml, "nvmlDeviceGetUUID");
  auto memory_of = resolve<PFN_nvmlDeviceGetMemoryInfo>(nvml, "nvmlDeviceGetMemoryInfo");
  if (const nvmlReturn_t status = init(); status != NVML_SUCCESS) {
    throw std::runtime_error(fmt::format("nvmlInit failed with NVML error {}", status));
  }
  unsigned devices = 0;
  if (const nvmlReturn_t status = count(&devices); status != NVML_SUCCESS) {
    throw std::runtime_error(fmt::format("NVML cannot count the GPUs: error {}", status));
  }
  std::vector<GpuInfo> gpus;
  for (unsigned index = 0; index < devices; ++index) {
    nvmlDevice_t device = nullptr;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    nvmlMemory_t memory{};
    if (by_index(index, &device) != NVML_SUCCESS ||
        name_of(device, name, sizeof name) != NVML_SUCCESS ||
        uuid_of(device, uuid, sizeof uuid) != NVML_SUCCESS ||
        memory_of(device, &memory) != NVML_SUCCESS) {
      throw std::runtime_error(fmt::format("NVML could not describe device {}", index));
    }
    gpus.push_back({index, name, uuid, memory.total, memory.used});
  }
  return gpus;
}

}  // namespace tessera::cli
