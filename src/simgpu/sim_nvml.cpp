// The simulated NVML (libnvidia-ml.so.1). Like the real one it ignores
// CUDA_VISIBLE_DEVICES and reports every device of the machine.
#include "simgpu/sim_nvml.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "cuda_abi/nvml_abi.h"
#include "simgpu/sim_config.h"
#include "simgpu/sim_export.h"
#include "simgpu/sim_machine.h"

using namespace tessera::abi;
using tessera::sim::machine;

namespace tessera::sim::nvml {

// Device handles point into this array; the index is the machine device.
char device_handles[tessera::kMostDevices];
bool initialized = false;

nvmlReturn_t device_index(nvmlDevice_t device, int& index) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  const auto* handle = reinterpret_cast<const char*>(device);
  if (handle < device_handles || handle >= device_handles + machine().spec().device_count) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  index = static_cast<int>(handle - device_handles);
  return NVML_SUCCESS;
}

nvmlDevice_t handle_of(int index) {
  return reinterpret_cast<nvmlDevice_t>(&device_handles[index]);
}

nvmlReturn_t copy_string(char* out, unsigned length, const char* text) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (std::strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, text, std::strlen(text) + 1);
  return NVML_SUCCESS;
}

}  // namespace tessera::sim::nvml

using namespace tessera::sim::nvml;

namespace {

// What a current driver reports (tesseraSimulatedGpu tells it is simulated).
constexpr const char* kDriverVersion = "580.65.06";
constexpr int kCudaDriverVersion = 13000;

}  // namespace

// Lets tools tell the simulated NVML from NVIDIA's.
SIM_EXPORT const char* tesseraSimulatedGpu() {
  return "Tessera simulated GPU";
}

SIM_EXPORT nvmlReturn_t nvmlInit_v2() {
  tessera::ErrorText error;
  if (!machine().attach(error)) {
    tessera::log(tessera::LogLevel::error, "simgpu", "%s", error.text);
    return NVML_ERROR_DRIVER_NOT_LOADED;
  }
  initialized = true;
  return NVML_SUCCESS;
}
SIM_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int) {
  return nvmlInit_v2();
}
SIM_EXPORT nvmlReturn_t nvmlShutdown() {
  return NVML_SUCCESS;
}

SIM_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
      return "Argument Version Mismatch";
    case NVML_ERROR_TIMEOUT:
      return "Timeout";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  return copy_string(version, length, kDriverVersion);
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *version = kCudaDriverVersion;
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = static_cast<unsigned>(machine().spec().device_count);
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= static_cast<unsigned>(machine().spec().device_count)) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  *device = handle_of(static_cast<int>(index));
  return NVML_SUCCESS;
}

// The first NVML's name for it, still exported by every driver.
SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (uuid == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < machine().spec().device_count; ++i) {
    if (std::strcmp(machine().spec().devices[i].uuid, uuid) == 0) {
      *device = handle_of(i);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  int machine_index = 0;
  if (nvmlReturn_t status = device_index(device, machine_index); status != NVML_SUCCESS) {
    return status;
  }
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *index = static_cast<unsigned>(machine_index);
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  if (is_mig_handle(device)) return mig_device_name(device, name, length);
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  return copy_string(name, length, machine().spec().devices[index].name);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  if (is_mig_handle(device)) return mig_device_uuid(device, uuid, length);
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  return copy_string(uuid, length, machine().spec().devices[index].uuid);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  if (is_mig_handle(device)) return mig_device_memory(device, memory);
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const std::uint64_t total = machine().spec().devices[index].memory_bytes;
  const std::uint64_t used = machine().used(index);
  memory->total = total;
  memory->used = used;
  memory->free = used < total ? total - used : 0;
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  nvmlMemory_t plain{};
  if (nvmlReturn_t status = nvmlDeviceGetMemoryInfo(device, &plain); status != NVML_SUCCESS) {
    return status;
  }
  memory->total = plain.total;
  memory->reserved = 0;
  memory->free = plain.free;
  memory->used = plain.used;
  return NVML_SUCCESS;
}

namespace {

// The device's processes (those holding memory on it) into `infos`, NVML's way: the count
// is set whatever happens, and too small a buffer is NVML_ERROR_INSUFFICIENT_SIZE. A MIG
// device lists the processes in its GPU instance; a GPU, its own and every instance's.
template <typename Info, typename Fill>
nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int* count, Info* infos, Fill fill) {
  constexpr int kMost = tessera::kMostMembers * (1 + tessera::sim::kMigSlots);
  MigProcess found[kMost];
  int total = 0;
  if (is_mig_handle(device)) {
    total = mig_processes(device, -1, found, kMost);
  } else {
    int index = 0;
    if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
    std::int32_t pids[tessera::kMostMembers];
    std::uint64_t used[tessera::kMostMembers];
    const int whole = machine().processes(index, pids, used, tessera::kMostMembers);
    for (; total < whole && total < tessera::kMostMembers; ++total) {
      found[total] = {static_cast<unsigned>(pids[total]), used[total], 0xFFFFFFFFu, 0xFFFFFFFFu};
    }
    total += mig_processes(device, index, found + total, kMost - total);
  }
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (total > kMost) total = kMost;
  const unsigned capacity = *count;
  *count = static_cast<unsigned>(total);
  if (static_cast<unsigned>(total) > capacity || (total > 0 && infos == nullptr)) {
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  for (int i = 0; i < total; ++i) infos[i] = fill(found[i]);
  return NVML_SUCCESS;
}

nvmlProcessInfo_t process_info(const MigProcess& process) {
  return nvmlProcessInfo_t{process.pid, process.used, process.gpu_instance,
                           process.compute_instance};
}

}  // namespace

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                unsigned int* count,
                                                                nvmlProcessInfo_t* infos) {
  return running_processes(device, count, infos, process_info);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                unsigned int* count,
                                                                nvmlProcessInfo_t* infos) {
  return running_processes(device, count, infos, process_info);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                             unsigned int* count,
                                                             nvmlProcessInfo_v1_t* infos) {
  return running_processes(device, count, infos, [](const MigProcess& process) {
    return nvmlProcessInfo_v1_t{process.pid, process.used};
  });
}

// One sample per process that ran on the device since lastSeenTimeStamp (at most the last
// second), its SM utilisation read from the device's own record of what ran when.
SIM_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                        nvmlProcessUtilizationSample_t* samples,
                                                        unsigned int* count,
                                                        unsigned long long last_seen_us) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  timespec wall{};
  clock_gettime(CLOCK_REALTIME, &wall);
  const std::uint64_t now_us = static_cast<std::uint64_t>(wall.tv_sec) * 1'000'000 +
                               static_cast<std::uint64_t>(wall.tv_nsec) / 1000;
  const std::uint64_t now_ns = tessera::monotonic_ns();
  constexpr std::uint64_t kWindowUs = 1'000'000;
  std::uint64_t window_us = kWindowUs;
  if (last_seen_us != 0 && last_seen_us < now_us && now_us - last_seen_us < window_us) {
    window_us = now_us - last_seen_us;
  }
  if (last_seen_us >= now_us) return NVML_ERROR_NOT_FOUND;
  const std::uint64_t from_ns = now_ns > window_us * 1000 ? now_ns - window_us * 1000 : 0;
  std::int32_t pids[tessera::kMostMembers];
  std::uint64_t busy_ns[tessera::kMostMembers];
  const int ran_count =
      machine().busy_processes(index, from_ns, now_ns, pids, busy_ns, tessera::kMostMembers);
  nvmlProcessUtilizationSample_t found[tessera::kMostMembers];
  unsigned ran = 0;
  for (int i = 0; i < ran_count; ++i) {
    const std::uint64_t percent = (busy_ns[i] * 100 + window_us * 500) / (window_us * 1000);
    found[ran++] =
        nvmlProcessUtilizationSample_t{static_cast<unsigned>(pids[i]),
                                       now_us,
                                       static_cast<unsigned>(percent > 100 ? 100 : percent),
                                       0,
                                       0,
                                       0};
  }
  if (ran == 0) {
    *count = 0;
    return NVML_ERROR_NOT_FOUND;
  }
  const unsigned capacity = *count;
  *count = ran;
  if (samples == nullptr || capacity < ran) return NVML_ERROR_INSUFFICIENT_SIZE;
  for (unsigned i = 0; i < ran; ++i) samples[i] = found[i];
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major,
                                                           int* minor) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  if (major == nullptr || minor == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *major = machine().spec().devices[index].cc_major;
  *minor = machine().spec().devices[index].cc_minor;
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  std::memset(pci, 0, sizeof *pci);
  const char* bus_id = machine().spec().devices[index].pci_bus_id;  // "00000000:BB:00.0"
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  std::sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function);
  pci->domain = domain;
  pci->bus = bus;
  pci->device = slot;
  pci->pciDeviceId = machine().spec().devices[index].pci_device_id;
  std::snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
  std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain, bus, slot,
                function);
  return NVML_SUCCESS;
}

// MIG is an Ampere-and-later datacentre feature: the presets of compute capability 8.0 and
// 9.0 have it (disabled until asked for), the older ones do not.

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int* node) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  if (node == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const int numa = machine().spec().devices[index].numa_node;
  if (numa < 0) return NVML_ERROR_NOT_SUPPORTED;
  *node = static_cast<unsigned>(numa);
  return NVML_SUCCESS;
}

// --- events ------------------------------------------------------------------------------

namespace {

constexpr unsigned long long kSupportedEvents =
    nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError;

}  // namespace

// An event set: which events of which device it collects, and how far it has read the
// machine's record of raised events (it sees those raised after it was made).
struct tessera::abi::nvmlEventSet_st {
  unsigned long long wanted[tessera::kMostDevices];
  std::uint64_t next;
};

SIM_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  // calloc, not new: the simulated driver, a guest in other processes, links no C++ runtime.
  auto* made = static_cast<nvmlEventSet_st*>(std::calloc(1, sizeof(nvmlEventSet_st)));
  if (made == nullptr) return NVML_ERROR_UNKNOWN;
  made->next = machine().events_raised();
  *set = made;
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  std::free(set);
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                         unsigned long long* types) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  if (types == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *types = kSupportedEvents;
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                                 nvmlEventSet_t set) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (tessera::sim::injected_failure("nvmlDeviceRegisterEvents")) return NVML_ERROR_UNKNOWN;
  if ((types & ~kSupportedEvents) != 0) return NVML_ERROR_NOT_SUPPORTED;
  set->wanted[index] |= types;
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data,
                                            unsigned int timeout_ms) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (set == nullptr || data == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const std::uint64_t deadline = tessera::monotonic_ns() + std::uint64_t{timeout_ms} * 1'000'000;
  for (;;) {
    const std::uint64_t raised = machine().events_raised();
    // A set that fell more than the ring behind has lost the oldest: it skips them.
    if (raised - set->next > tessera::sim::kDeviceEvents) {
      set->next = raised - tessera::sim::kDeviceEvents;
    }
    while (set->next < raised) {
      tessera::sim::DeviceEvent event{};
      const bool readable = machine().event(set->next++, event);
      if (!readable || event.device < 0 || event.device >= machine().spec().device_count) continue;
      if ((set->wanted[event.device] & event.type) == 0) continue;
      *data = nvmlEventData_t{handle_of(event.device), event.type, event.data, 0xFFFFFFFFu,
                              0xFFFFFFFFu};
      return NVML_SUCCESS;
    }
    const std::uint64_t now = tessera::monotonic_ns();
    if (now >= deadline) return NVML_ERROR_TIMEOUT;
    machine().wait_for_event(raised, static_cast<unsigned>((deadline - now + 999'999) / 1'000'000));
  }
}

// Raises an event on a device, as a failing GPU would: `tessera simgpu event` calls it. Every
// process waiting on an event set that collects it wakes.
SIM_EXPORT nvmlReturn_t tesseraSimRaiseEvent(unsigned int index, unsigned long long type,
                                             unsigned long long data) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (index >= static_cast<unsigned>(machine().spec().device_count)) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  if ((type & kSupportedEvents) == 0 || (type & (type - 1)) != 0) return NVML_ERROR_NOT_SUPPORTED;
  machine().raise_event(static_cast<int>(index), type, data);
  return NVML_SUCCESS;
}
