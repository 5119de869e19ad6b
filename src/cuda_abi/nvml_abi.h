// Tessera's own declaration of the slice of NVML it speaks (see cuda_abi.h for why).
#pragma once

namespace tessera::abi {

using nvmlReturn_t = int;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;

inline constexpr nvmlReturn_t NVML_SUCCESS = 0;
inline constexpr nvmlReturn_t NVML_ERROR_UNINITIALIZED = 1;
inline constexpr nvmlReturn_t NVML_ERROR_INVALID_ARGUMENT = 2;
inline constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
inline constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
inline constexpr nvmlReturn_t NVML_ERROR_DRIVER_NOT_LOADED = 9;
inline constexpr nvmlReturn_t NVML_ERROR_NOT_FOUND = 6;
inline constexpr nvmlReturn_t NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25;
inline constexpr nvmlReturn_t NVML_ERROR_UNKNOWN = 999;

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
// NVML_STRUCT_VERSION(Memory, 2): sizeof(nvmlMemory_v2_t) | 2 << 24.
inline constexpr unsigned int nvmlMemory_v2 = 0x02000028;

struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

// What nvmlDeviceGetComputeRunningProcesses (version 1) fills in.
struct nvmlProcessInfo_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};

struct nvmlProcessUtilizationSample_t {
  unsigned int pid;
  unsigned long long timeStamp;  // CPU time of the sample, microseconds since the epoch
  unsigned int smUtil;
  unsigned int memUtil;
  unsigned int encUtil;
  unsigned int decUtil;
};

inline constexpr int NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96;
inline constexpr int NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96;
inline constexpr int NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80;

#define TESSERA_NVML_HOOKED(X)                                                   \
  X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t * memory))       \
  X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t * memory)) \
  X(nvmlDeviceGetComputeRunningProcesses_v3,                                     \
    (nvmlDevice_t device, unsigned int* infoCount, nvmlProcessInfo_t* infos))

#define TESSERA_NVML_PASSTHROUGH(X)                                            \
  X(nvmlInit_v2, ())                                                           \
  X(nvmlInitWithFlags, (unsigned int flags))                                   \
  X(nvmlShutdown, ())                                                          \
  X(nvmlSystemGetDriverVersion, (char* version, unsigned int length))          \
  X(nvmlDeviceGetCount_v2, (unsigned int* deviceCount))                        \
  X(nvmlDeviceGetHandleByIndex_v2, (unsigned int index, nvmlDevice_t* device)) \
  X(nvmlDeviceGetHandleByUUID, (const char* uuid, nvmlDevice_t* device))       \
  X(nvmlDeviceGetIndex, (nvmlDevice_t device, unsigned int* index))            \
  X(nvmlDeviceGetName, (nvmlDevice_t device, char* name, unsigned int length)) \
  X(nvmlDeviceGetUUID, (nvmlDevice_t device, char* uuid, unsigned int length))

#define TESSERA_DECLARE_NVML_PFN(name, params) using PFN_##name = nvmlReturn_t(*) params;
TESSERA_NVML_HOOKED(TESSERA_DECLARE_NVML_PFN)
TESSERA_NVML_PASSTHROUGH(TESSERA_DECLARE_NVML_PFN)
#undef TESSERA_DECLARE_NVML_PFN

extern "C" const char* nvmlErrorString(nvmlReturn_t result);

}  // namespace tessera::abi
