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
inline constexpr nvmlReturn_t NVML_ERROR_NOT_FOUND = 6;
inline constexpr nvmlReturn_t NVML_ERROR_DRIVER_NOT_LOADED = 9;
inline constexpr nvmlReturn_t NVML_ERROR_TIMEOUT = 10;
inline constexpr nvmlReturn_t NVML_ERROR_FUNCTION_NOT_FOUND = 13;
inline constexpr nvmlReturn_t NVML_ERROR_GPU_IS_LOST = 15;
inline constexpr nvmlReturn_t NVML_ERROR_RESET_REQUIRED = 16;
inline constexpr nvmlReturn_t NVML_ERROR_IN_USE = 19;
inline constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_RESOURCES = 23;
inline constexpr nvmlReturn_t NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25;
inline constexpr nvmlReturn_t NVML_ERROR_INVALID_STATE = 29;
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

// PCI location (nvmlDeviceGetPciInfo_v3).
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;  // device id << 16 | vendor id
  unsigned int pciSubSystemId;
  char busId[32];  // "00000000:17:00.0"
};

// What nvmlDeviceGetAttributes_v2 reports of a device (or of a MIG device).
struct nvmlDeviceAttributes_t {
  unsigned int multiprocessorCount;
  unsigned int sharedCopyEngineCount;
  unsigned int sharedDecoderCount;
  unsigned int sharedEncoderCount;
  unsigned int sharedJpegCount;
  unsigned int sharedOfaCount;
  unsigned int gpuInstanceSliceCount;
  unsigned int computeInstanceSliceCount;
  unsigned long long memorySizeMB;
};

// Events: an event set collects what devices registered for it raise.
struct nvmlEventSet_st;
using nvmlEventSet_t = nvmlEventSet_st*;
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the XID, for an XID critical error
  unsigned int gpuInstanceId;    // 0xFFFFFFFF unless the event is a MIG device's
  unsigned int computeInstanceId;
};
inline constexpr unsigned long long nvmlEventTypeSingleBitEccError = 0x1;
inline constexpr unsigned long long nvmlEventTypeDoubleBitEccError = 0x2;
inline constexpr unsigned long long nvmlEventTypePState = 0x4;
inline constexpr unsigned long long nvmlEventTypeXidCriticalError = 0x8;
inline constexpr unsigned long long nvmlEventTypeClock = 0x10;

// MIG: a GPU instance profile as nvmlDeviceGetGpuInstanceProfileInfoV reports it, and the
// places in memory slices where an instance of it may start.
struct nvmlGpuInstanceProfileInfo_v2_t {
  unsigned int version;
  unsigned int id;  // the profile ID (19 for 1g.10gb), which the other MIG calls take
  unsigned int isP2pSupported;
  unsigned int sliceCount;  // compute slices
  unsigned int instanceCount;
  unsigned int multiprocessorCount;
  unsigned int copyEngineCount;
  unsigned int decoderCount;
  unsigned int encoderCount;
  unsigned int jpegCount;
  unsigned int ofaCount;
  unsigned long long memorySizeMB;
  char name[96];  // "MIG 1g.10gb"
};
// NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2): sizeof | 2 << 24.
inline constexpr unsigned int nvmlGpuInstanceProfileInfo_v2 = 0x02000098;
static_assert(sizeof(nvmlGpuInstanceProfileInfo_v2_t) == 0x98);
struct nvmlGpuInstancePlacement_t {
  unsigned int start;
  unsigned int size;
};

// GPU and compute instances, and what NVML says of them.
struct nvmlGpuInstance_st;
using nvmlGpuInstance_t = nvmlGpuInstance_st*;
struct nvmlComputeInstance_st;
using nvmlComputeInstance_t = nvmlComputeInstance_st*;
struct nvmlGpuInstanceInfo_t {
  nvmlDevice_t device;
  unsigned int id;
  unsigned int profileId;
  nvmlGpuInstancePlacement_t placement;
};
struct nvmlComputeInstanceProfileInfo_v2_t {
  unsigned int version;
  unsigned int id;
  unsigned int sliceCount;
  unsigned int instanceCount;
  unsigned int multiprocessorCount;
  unsigned int sharedCopyEngineCount;
  unsigned int sharedDecoderCount;
  unsigned int sharedEncoderCount;
  unsigned int sharedJpegCount;
  unsigned int sharedOfaCount;
  char name[96];
};
inline constexpr unsigned int nvmlComputeInstanceProfileInfo_v2 = 0x02000088;
static_assert(sizeof(nvmlComputeInstanceProfileInfo_v2_t) == 0x88);
struct nvmlComputeInstanceInfo_t {
  nvmlDevice_t device;
  nvmlGpuInstance_t gpuInstance;
  unsigned int id;
  unsigned int profileId;
  nvmlGpuInstancePlacement_t placement;  // nvmlComputeInstancePlacement_t: the same fields
};
inline constexpr unsigned int NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0;

inline constexpr unsigned int NVML_DEVICE_MIG_DISABLE = 0;
inline constexpr unsigned int NVML_DEVICE_MIG_ENABLE = 1;

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

// What the node agent asks of NVML beyond that: inventory, MIG mode and health events.
#define TESSERA_NVML_INVENTORY(X)                                                              \
  X(nvmlSystemGetCudaDriverVersion_v2, (int* cudaDriverVersion))                               \
  X(nvmlDeviceGetCudaComputeCapability, (nvmlDevice_t device, int* major, int* minor))         \
  X(nvmlDeviceGetPciInfo_v3, (nvmlDevice_t device, nvmlPciInfo_t * pci))                       \
  X(nvmlDeviceGetMigMode,                                                                      \
    (nvmlDevice_t device, unsigned int* currentMode, unsigned int* pendingMode))               \
  X(nvmlDeviceGetAttributes_v2, (nvmlDevice_t device, nvmlDeviceAttributes_t * attributes))    \
  X(nvmlDeviceGetNumaNodeId, (nvmlDevice_t device, unsigned int* node))                        \
  X(nvmlEventSetCreate, (nvmlEventSet_t * set))                                                \
  X(nvmlDeviceGetSupportedEventTypes, (nvmlDevice_t device, unsigned long long* eventTypes))   \
  X(nvmlDeviceRegisterEvents,                                                                  \
    (nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set))                  \
  X(nvmlEventSetWait_v2, (nvmlEventSet_t set, nvmlEventData_t * data, unsigned int timeoutms)) \
  X(nvmlEventSetFree, (nvmlEventSet_t set))                                                    \
  X(nvmlDeviceGetGpuInstanceProfileInfoV,                                                      \
    (nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_v2_t* info))        \
  X(nvmlDeviceGetGpuInstancePossiblePlacements_v2,                                             \
    (nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t* placements,      \
     unsigned int* count))

// What tessera mig asks of NVML to lay out MIG, and the node agent to find MIG devices.
#define TESSERA_NVML_MIG(X)                                                                        \
  X(nvmlDeviceSetMigMode,                                                                          \
    (nvmlDevice_t device, unsigned int mode, nvmlReturn_t* activationStatus))                      \
  X(nvmlDeviceCreateGpuInstanceWithPlacement,                                                      \
    (nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t* placement,     \
     nvmlGpuInstance_t* gpuInstance))                                                              \
  X(nvmlDeviceGetGpuInstances, (nvmlDevice_t device, unsigned int profileId,                       \
                                nvmlGpuInstance_t* gpuInstances, unsigned int* count))             \
  X(nvmlGpuInstanceGetInfo, (nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t * info))         \
  X(nvmlGpuInstanceDestroy, (nvmlGpuInstance_t gpuInstance))                                       \
  X(nvmlGpuInstanceGetComputeInstanceProfileInfoV,                                                 \
    (nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,                 \
     nvmlComputeInstanceProfileInfo_v2_t* info))                                                   \
  X(nvmlGpuInstanceCreateComputeInstance, (nvmlGpuInstance_t gpuInstance, unsigned int profileId,  \
                                           nvmlComputeInstance_t* computeInstance))                \
  X(nvmlGpuInstanceGetComputeInstances,                                                            \
    (nvmlGpuInstance_t gpuInstance, unsigned int profileId,                                        \
     nvmlComputeInstance_t* computeInstances, unsigned int* count))                                \
  X(nvmlComputeInstanceGetInfo_v2,                                                                 \
    (nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t * info))                     \
  X(nvmlComputeInstanceDestroy, (nvmlComputeInstance_t computeInstance))                           \
  X(nvmlDeviceGetMaxMigDeviceCount, (nvmlDevice_t device, unsigned int* count))                    \
  X(nvmlDeviceGetMigDeviceHandleByIndex,                                                           \
    (nvmlDevice_t device, unsigned int index, nvmlDevice_t* migDevice))                            \
  X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle, (nvmlDevice_t migDevice, nvmlDevice_t * device)) \
  X(nvmlDeviceGetGpuInstanceId, (nvmlDevice_t device, unsigned int* id))                           \
  X(nvmlDeviceGetComputeInstanceId, (nvmlDevice_t device, unsigned int* id))

#define TESSERA_DECLARE_NVML_PFN(name, params) using PFN_##name = nvmlReturn_t(*) params;
TESSERA_NVML_HOOKED(TESSERA_DECLARE_NVML_PFN)
TESSERA_NVML_PASSTHROUGH(TESSERA_DECLARE_NVML_PFN)
TESSERA_NVML_INVENTORY(TESSERA_DECLARE_NVML_PFN)
TESSERA_NVML_MIG(TESSERA_DECLARE_NVML_PFN)
#undef TESSERA_DECLARE_NVML_PFN

extern "C" const char* nvmlErrorString(nvmlReturn_t result);

}  // namespace tessera::abi
