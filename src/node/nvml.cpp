#include "node/nvml.h"

#include <dlfcn.h>
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <stdexcept>

#include "base/strings.h"

namespace tessera::node {

using namespace tessera::abi;

Nvml::Nvml(const std::string& library) : library_(library) {
  handle_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    throw std::runtime_error(fmt::format("cannot load NVML ({}): {}", library, dlerror()));
  }
  simulated_ = dlsym(handle_, "tesseraSimulatedGpu") != nullptr;
  error_string_ =
      reinterpret_cast<const char* (*)(nvmlReturn_t)>(dlsym(handle_, "nvmlErrorString"));
  // The basic calls every driver has; the inventory's are looked up too, and left null where
  // an older driver lacks them.
#define TESSERA_NVML_RESOLVE(name, params) \
  name = reinterpret_cast<PFN_##name>(dlsym(handle_, #name));
  TESSERA_NVML_PASSTHROUGH(TESSERA_NVML_RESOLVE)
  TESSERA_NVML_INVENTORY(TESSERA_NVML_RESOLVE)
  TESSERA_NVML_MIG(TESSERA_NVML_RESOLVE)
#undef TESSERA_NVML_RESOLVE
  nvmlDeviceGetMemoryInfo =
      reinterpret_cast<PFN_nvmlDeviceGetMemoryInfo>(dlsym(handle_, "nvmlDeviceGetMemoryInfo"));
  nvmlDeviceGetComputeRunningProcesses_v3 =
      reinterpret_cast<PFN_nvmlDeviceGetComputeRunningProcesses_v3>(
          dlsym(handle_, "nvmlDeviceGetComputeRunningProcesses_v3"));
  for (const auto& [function, name] :
       {std::pair<void*, const char*>{reinterpret_cast<void*>(nvmlInit_v2), "nvmlInit_v2"},
        {reinterpret_cast<void*>(nvmlDeviceGetCount_v2), "nvmlDeviceGetCount_v2"},
        {reinterpret_cast<void*>(nvmlDeviceGetHandleByIndex_v2), "nvmlDeviceGetHandleByIndex_v2"},
        {reinterpret_cast<void*>(nvmlDeviceGetUUID), "nvmlDeviceGetUUID"},
        {reinterpret_cast<void*>(nvmlDeviceGetName), "nvmlDeviceGetName"},
        {reinterpret_cast<void*>(nvmlDeviceGetMemoryInfo), "nvmlDeviceGetMemoryInfo"},
        {reinterpret_cast<void*>(nvmlSystemGetDriverVersion), "nvmlSystemGetDriverVersion"}}) {
    if (function == nullptr) {
      throw std::runtime_error(fmt::format("NVML ({}) lacks {}", library, name));
    }
  }
  if (const nvmlReturn_t status = nvmlInit_v2(); status != NVML_SUCCESS) {
    throw std::runtime_error(
        fmt::format("NVML ({}) failed to initialise: {}", library, error_text(status)));
  }
}

Nvml::~Nvml() {
  // Shut down, but not unloaded: a driver library is not made to be unloaded and loaded again.
  if (nvmlShutdown != nullptr) nvmlShutdown();
}

std::string Nvml::error_text(nvmlReturn_t status) const {
  const char* text = error_string_ != nullptr ? error_string_(status) : nullptr;
  return fmt::format("{} (NVML error {})", text != nullptr ? text : "unknown", status);
}

namespace {

// The NUMA node Linux gives the GPU's PCI function, as NVIDIA's plugin reads it.
int numa_node_from_sysfs(const std::string& bus_id) {
  // NVML writes an 8-digit domain ("00000000:17:00.0"); sysfs a 4-digit one.
  const std::string name =
      base::lower(bus_id.size() > 4 && bus_id.find(':') == 8 ? bus_id.substr(4) : bus_id);
  if (name.find('/') != std::string::npos || name.find("..") != std::string::npos) return -1;
  std::ifstream input("/sys/bus/pci/devices/" + name + "/numa_node");
  int node = -1;
  if (!(input >> node) || node < 0) return -1;
  return node;
}

}  // namespace

Inventory read_inventory(Nvml& nvml) {
  Inventory inventory;
  inventory.simulated = nvml.simulated();
  char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  if (const nvmlReturn_t status = nvml.nvmlSystemGetDriverVersion(version, sizeof version);
      status != NVML_SUCCESS) {
    throw std::runtime_error(
        fmt::format("NVML cannot say the driver version: {}", nvml.error_text(status)));
  }
  inventory.driver_version = version;
  int cuda = 0;
  if (nvml.nvmlSystemGetCudaDriverVersion_v2 != nullptr &&
      nvml.nvmlSystemGetCudaDriverVersion_v2(&cuda) == NVML_SUCCESS) {
    inventory.cuda_major = cuda / 1000;
    inventory.cuda_minor = cuda % 1000 / 10;
  }
  unsigned count = 0;
  if (const nvmlReturn_t status = nvml.nvmlDeviceGetCount_v2(&count); status != NVML_SUCCESS) {
    throw std::runtime_error(
        fmt::format("NVML cannot count the GPUs: {}", nvml.error_text(status)));
  }
  for (unsigned index = 0; index < count; ++index) {
    GpuInfo gpu;
    gpu.index = index;
    nvmlDevice_t device = nullptr;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    nvmlMemory_t memory{};
    auto require = [&](nvmlReturn_t status, const char* call) {
      if (status != NVML_SUCCESS) {
        throw std::runtime_error(fmt::format("NVML cannot describe GPU {}: {}: {}", index, call,
                                             nvml.error_text(status)));
      }
    };
    require(nvml.nvmlDeviceGetHandleByIndex_v2(index, &device), "nvmlDeviceGetHandleByIndex");
    require(nvml.nvmlDeviceGetName(device, name, sizeof name), "nvmlDeviceGetName");
    require(nvml.nvmlDeviceGetUUID(device, uuid, sizeof uuid), "nvmlDeviceGetUUID");
    require(nvml.nvmlDeviceGetMemoryInfo(device, &memory), "nvmlDeviceGetMemoryInfo");
    gpu.name = name;
    gpu.uuid = uuid;
    gpu.memory_bytes = memory.total;
    gpu.memory_used = memory.used;
    if (nvml.nvmlDeviceGetCudaComputeCapability != nullptr) {
      require(nvml.nvmlDeviceGetCudaComputeCapability(device, &gpu.cc_major, &gpu.cc_minor),
              "nvmlDeviceGetCudaComputeCapability");
    }
    nvmlPciInfo_t pci{};
    if (nvml.nvmlDeviceGetPciInfo_v3 != nullptr &&
        nvml.nvmlDeviceGetPciInfo_v3(device, &pci) == NVML_SUCCESS) {
      gpu.pci_bus_id = std::string(pci.busId, strnlen(pci.busId, sizeof pci.busId));
    }
    unsigned numa = 0;
    if (nvml.nvmlDeviceGetNumaNodeId != nullptr &&
        nvml.nvmlDeviceGetNumaNodeId(device, &numa) == NVML_SUCCESS) {
      gpu.numa_node = static_cast<int>(numa);
    } else if (!gpu.pci_bus_id.empty()) {
      gpu.numa_node = numa_node_from_sysfs(gpu.pci_bus_id);
    }
    unsigned current = 0, pending = 0;
    if (nvml.nvmlDeviceGetMigMode != nullptr &&
        nvml.nvmlDeviceGetMigMode(device, &current, &pending) == NVML_SUCCESS) {
      gpu.mig_capable = true;
      gpu.mig_enabled = current == NVML_DEVICE_MIG_ENABLE;
    }
    inventory.gpus.push_back(std::move(gpu));
  }
  return inventory;
}

EventSet::EventSet(Nvml& nvml, const Inventory& inventory, std::uint64_t types) : nvml_(nvml) {
  if (nvml.nvmlEventSetCreate == nullptr || nvml.nvmlDeviceRegisterEvents == nullptr ||
      nvml.nvmlEventSetWait_v2 == nullptr || nvml.nvmlEventSetFree == nullptr) {
    throw std::runtime_error("this NVML has no event sets; health checks are off");
  }
  if (const nvmlReturn_t status = nvml.nvmlEventSetCreate(&set_); status != NVML_SUCCESS) {
    throw std::runtime_error(
        fmt::format("cannot create an NVML event set: {}", nvml.error_text(status)));
  }
  for (const GpuInfo& gpu : inventory.gpus) {
    uuids_.push_back(gpu.uuid);
    nvmlDevice_t device = nullptr;
    nvmlReturn_t status = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid.c_str(), &device);
    unsigned long long supported = types;
    if (status == NVML_SUCCESS && nvml.nvmlDeviceGetSupportedEventTypes != nullptr) {
      status = nvml.nvmlDeviceGetSupportedEventTypes(device, &supported);
    }
    if (status == NVML_SUCCESS)
      status = nvml.nvmlDeviceRegisterEvents(device, types & supported, set_);
    if (status != NVML_SUCCESS) {
      unwatched_.emplace_back(static_cast<int>(gpu.index), nvml.error_text(status));
    }
  }
}

EventSet::~EventSet() {
  if (set_ != nullptr) nvml_.nvmlEventSetFree(set_);
}

EventSet::Outcome EventSet::wait(unsigned timeout_ms, DeviceEvent& event, std::string& error) {
  nvmlEventData_t data{};
  const nvmlReturn_t status = nvml_.nvmlEventSetWait_v2(set_, &data, timeout_ms);
  if (status == NVML_ERROR_TIMEOUT) return Outcome::timeout;
  if (status != NVML_SUCCESS) {
    error = nvml_.error_text(status);
    return Outcome::failed;
  }
  event = DeviceEvent{-1, data.eventType, data.eventData};
  char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
  if (data.device != nullptr &&
      nvml_.nvmlDeviceGetUUID(data.device, uuid, sizeof uuid) == NVML_SUCCESS) {
    const auto found = std::find(uuids_.begin(), uuids_.end(), std::string(uuid));
    if (found != uuids_.end()) event.gpu = static_cast<int>(found - uuids_.begin());
  }
  return Outcome::event;
}

}  // namespace tessera::node
