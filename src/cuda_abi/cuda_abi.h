// Tessera's own declaration of the slice of the CUDA driver API it speaks.
//
// Tessera builds without the CUDA toolkit, so the types and entry points it interposes
// (src/hook) and simulates (src/simgpu) are declared here from the public driver API
// documentation. tests/cuda_abi/abi_check.cpp compares every declaration with NVIDIA's headers
// wherever the toolkit is installed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::abi {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;
using cuuint64_t = std::uint64_t;

struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUarray_st;
struct CUmipmappedArray_st;
struct CUmemPoolHandle_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUlaunchAttribute_st;
struct CUctxCreateParams_st;
struct CUexecAffinityParam_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUarray = CUarray_st*;
using CUmipmappedArray = CUmipmappedArray_st*;
using CUmemoryPool = CUmemPoolHandle_st*;
using CUgraph = CUgraph_st*;
using CUgraphExec = CUgraphExec_st*;
using CUhostFn = void (*)(void* userData);

// Result codes (CUresult values).
inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
inline constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
inline constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
inline constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
inline constexpr CUresult CUDA_ERROR_MPS_CONNECTION_FAILED = 805;
inline constexpr CUresult CUDA_ERROR_MPS_RPC_FAILURE = 806;
inline constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900;
inline constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901;
inline constexpr CUresult CUDA_ERROR_CAPTURED_EVENT = 907;

// CUstreamCaptureStatus values.
inline constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
inline constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
inline constexpr int CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2;
inline constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

struct CUuuid {
  char bytes[16];
};

// CUdevice_attribute values Tessera reads.
inline constexpr int CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
inline constexpr int CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10;
inline constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
inline constexpr int CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33;
inline constexpr int CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38;
inline constexpr int CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39;
inline constexpr int CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50;
inline constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81;
inline constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
inline constexpr int CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR = 106;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
inline constexpr int CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102;
inline constexpr int CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115;

// cuGetProcAddress flags and symbol status.
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_DEFAULT = 0;
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1;
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2;
using CUdriverProcAddressQueryResult = int;
inline constexpr int CU_GET_PROC_ADDRESS_SUCCESS = 0;
inline constexpr int CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1;
inline constexpr int CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2;

// Virtual memory management.
inline constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 1;
inline constexpr int CU_MEM_LOCATION_TYPE_HOST = 2;
inline constexpr int CU_MEM_LOCATION_TYPE_HOST_NUMA = 3;
inline constexpr int CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4;
inline constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 1;
inline constexpr int CU_MEM_HANDLE_TYPE_NONE = 0;
inline constexpr int CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1;
inline constexpr int CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0;
inline constexpr int CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1;

struct CUmemLocation {
  int type;
  int id;
};
struct CUmemAllocationProp {
  int type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;
};

// Stream-ordered allocator.
struct CUmemPoolProps {
  int allocType;
  int handleTypes;
  CUmemLocation location;
  void* win32SecurityAttributes;
  std::size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
};
inline constexpr int CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4;
inline constexpr int CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5;
inline constexpr int CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6;
inline constexpr int CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7;
inline constexpr int CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8;

// Arrays.
inline constexpr int CU_AD_FORMAT_UNSIGNED_INT8 = 0x01;
inline constexpr int CU_AD_FORMAT_UNSIGNED_INT16 = 0x02;
inline constexpr int CU_AD_FORMAT_UNSIGNED_INT32 = 0x03;
inline constexpr int CU_AD_FORMAT_SIGNED_INT8 = 0x08;
inline constexpr int CU_AD_FORMAT_SIGNED_INT16 = 0x09;
inline constexpr int CU_AD_FORMAT_SIGNED_INT32 = 0x0a;
inline constexpr int CU_AD_FORMAT_HALF = 0x10;
inline constexpr int CU_AD_FORMAT_FLOAT = 0x20;
// Bytes per channel of an array format; 0 for a format Tessera does not know.
constexpr int array_format_bytes(int format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return 0;
  }
}

struct CUDA_ARRAY_DESCRIPTOR {
  std::size_t Width;
  std::size_t Height;
  int Format;
  unsigned int NumChannels;
};
struct CUDA_ARRAY3D_DESCRIPTOR {
  std::size_t Width;
  std::size_t Height;
  std::size_t Depth;
  int Format;
  unsigned int NumChannels;
  unsigned int Flags;
};
struct CUDA_ARRAY_MEMORY_REQUIREMENTS {
  std::size_t size;
  std::size_t alignment;
  unsigned int reserved[4];
};

// Launches.
struct CUlaunchConfig {
  unsigned int gridDimX;
  unsigned int gridDimY;
  unsigned int gridDimZ;
  unsigned int blockDimX;
  unsigned int blockDimY;
  unsigned int blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute_st* attrs;
  unsigned int numAttrs;
};

inline constexpr unsigned int CU_MEM_ATTACH_GLOBAL = 1;

#define TESSERA_LAUNCH_GRID_PARAMS                                                             \
  unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
      unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes

// Every driver entry point Tessera declares: X(name, parameter list).
// The hook interposes the ones in TESSERA_CUDA_HOOKED; the simulated driver implements all.
#define TESSERA_CUDA_HOOKED(X)                                                                    \
  X(cuInit, (unsigned int flags))                                                                 \
  X(cuGetProcAddress, (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags))        \
  X(cuGetProcAddress_v2, (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,      \
                          CUdriverProcAddressQueryResult* symbolStatus))                          \
  X(cuMemGetInfo_v2, (std::size_t * free, std::size_t * total))                                   \
  X(cuDeviceTotalMem_v2, (std::size_t * bytes, CUdevice dev))                                     \
  X(cuMemAlloc_v2, (CUdeviceptr * dptr, std::size_t bytesize))                                    \
  X(cuMemAllocPitch_v2, (CUdeviceptr * dptr, std::size_t * pPitch, std::size_t widthInBytes,      \
                         std::size_t height, unsigned int elementSizeBytes))                      \
  X(cuMemAllocManaged, (CUdeviceptr * dptr, std::size_t bytesize, unsigned int flags))            \
  X(cuMemFree_v2, (CUdeviceptr dptr))                                                             \
  X(cuMemAllocAsync, (CUdeviceptr * dptr, std::size_t bytesize, CUstream hStream))                \
  X(cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, std::size_t bytesize, CUstream hStream))           \
  X(cuMemAllocFromPoolAsync,                                                                      \
    (CUdeviceptr * dptr, std::size_t bytesize, CUmemoryPool pool, CUstream hStream))              \
  X(cuMemAllocFromPoolAsync_ptsz,                                                                 \
    (CUdeviceptr * dptr, std::size_t bytesize, CUmemoryPool pool, CUstream hStream))              \
  X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream))                                         \
  X(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream))                                    \
  X(cuMemPoolTrimTo, (CUmemoryPool pool, std::size_t minBytesToKeep))                             \
  X(cuMemPoolSetAttribute, (CUmemoryPool pool, int attr, void* value))                            \
  X(cuMemPoolDestroy, (CUmemoryPool pool))                                                        \
  X(cuStreamSynchronize, (CUstream hStream))                                                      \
  X(cuStreamSynchronize_ptsz, (CUstream hStream))                                                 \
  X(cuEventSynchronize, (CUevent hEvent))                                                         \
  X(cuCtxSynchronize, ())                                                                         \
  X(cuMemCreate, (CUmemGenericAllocationHandle * handle, std::size_t size,                        \
                  const CUmemAllocationProp* prop, unsigned long long flags))                     \
  X(cuMemRelease, (CUmemGenericAllocationHandle handle))                                          \
  X(cuMemMap, (CUdeviceptr ptr, std::size_t size, std::size_t offset,                             \
               CUmemGenericAllocationHandle handle, unsigned long long flags))                    \
  X(cuMemUnmap, (CUdeviceptr ptr, std::size_t size))                                              \
  X(cuMemImportFromShareableHandle,                                                               \
    (CUmemGenericAllocationHandle * handle, void* osHandle, int shHandleType))                    \
  X(cuArrayCreate_v2, (CUarray * pHandle, const CUDA_ARRAY_DESCRIPTOR* pAllocateArray))           \
  X(cuArray3DCreate_v2, (CUarray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray))       \
  X(cuArrayDestroy, (CUarray hArray))                                                             \
  X(cuMipmappedArrayCreate,                                                                       \
    (CUmipmappedArray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,              \
     unsigned int numMipmapLevels))                                                               \
  X(cuMipmappedArrayDestroy, (CUmipmappedArray hMipmappedArray))                                  \
  X(cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev))                         \
  X(cuCtxCreate_v3, (CUcontext * pctx, CUexecAffinityParam_st * paramsArray, int numParams,       \
                     unsigned int flags, CUdevice dev))                                           \
  X(cuCtxCreate_v4,                                                                               \
    (CUcontext * pctx, CUctxCreateParams_st * ctxCreateParams, unsigned int flags, CUdevice dev)) \
  X(cuCtxDestroy_v2, (CUcontext ctx))                                                             \
  X(cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev))                                   \
  X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                                 \
  X(cuDevicePrimaryCtxReset_v2, (CUdevice dev))                                                   \
  X(cuLaunchKernel, (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream,                  \
                     void** kernelParams, void** extra))                                          \
  X(cuLaunchKernel_ptsz, (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream,             \
                          void** kernelParams, void** extra))                                     \
  X(cuLaunchKernelEx,                                                                             \
    (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra))              \
  X(cuLaunchKernelEx_ptsz,                                                                        \
    (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra))              \
  X(cuLaunchCooperativeKernel,                                                                    \
    (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams))            \
  X(cuLaunchCooperativeKernel_ptsz,                                                               \
    (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams))            \
  X(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream))                                    \
  X(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream))                               \
  X(cuLaunchHostFunc, (CUstream hStream, CUhostFn fn, void* userData))                            \
  X(cuLaunchHostFunc_ptsz, (CUstream hStream, CUhostFn fn, void* userData))

// Entry points the hook calls on the real driver but does not interpose.
#define TESSERA_CUDA_PASSTHROUGH(X)                                                              \
  X(cuDriverGetVersion, (int* driverVersion))                                                    \
  X(cuDeviceGet, (CUdevice * device, int ordinal))                                               \
  X(cuDeviceGetCount, (int* count))                                                              \
  X(cuDeviceGetName, (char* name, int len, CUdevice dev))                                        \
  X(cuDeviceGetUuid, (CUuuid * uuid, CUdevice dev))                                              \
  X(cuDeviceGetUuid_v2, (CUuuid * uuid, CUdevice dev))                                           \
  X(cuDeviceGetAttribute, (int* pi, int attrib, CUdevice dev))                                   \
  X(cuDeviceGetPCIBusId, (char* pciBusId, int len, CUdevice dev))                                \
  X(cuCtxGetDevice, (CUdevice * device))                                                         \
  X(cuCtxGetCurrent, (CUcontext * pctx))                                                         \
  X(cuCtxSetCurrent, (CUcontext ctx))                                                            \
  X(cuCtxPushCurrent_v2, (CUcontext ctx))                                                        \
  X(cuCtxPopCurrent_v2, (CUcontext * pctx))                                                      \
  X(cuDeviceGetMemPool, (CUmemoryPool * pool, CUdevice dev))                                     \
  X(cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice dev))                              \
  X(cuDeviceSetMemPool, (CUdevice dev, CUmemoryPool pool))                                       \
  X(cuMemPoolCreate, (CUmemoryPool * pool, const CUmemPoolProps* poolProps))                     \
  X(cuMemPoolGetAttribute, (CUmemoryPool pool, int attr, void* value))                           \
  X(cuMemGetAllocationGranularity,                                                               \
    (std::size_t * granularity, const CUmemAllocationProp* prop, int option))                    \
  X(cuMemAddressReserve, (CUdeviceptr * ptr, std::size_t size, std::size_t alignment,            \
                          CUdeviceptr addr, unsigned long long flags))                           \
  X(cuMemAddressFree, (CUdeviceptr ptr, std::size_t size))                                       \
  X(cuMemSetAccess,                                                                              \
    (CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc, std::size_t count))         \
  X(cuMemExportToShareableHandle, (void* shareableHandle, CUmemGenericAllocationHandle handle,   \
                                   int handleType, unsigned long long flags))                    \
  X(cuMemGetAllocationPropertiesFromHandle,                                                      \
    (CUmemAllocationProp * prop, CUmemGenericAllocationHandle handle))                           \
  X(cuArrayGetMemoryRequirements,                                                                \
    (CUDA_ARRAY_MEMORY_REQUIREMENTS * memoryRequirements, CUarray array, CUdevice device))       \
  X(cuMipmappedArrayGetMemoryRequirements, (CUDA_ARRAY_MEMORY_REQUIREMENTS * memoryRequirements, \
                                            CUmipmappedArray mipmap, CUdevice device))           \
  X(cuMemGetAddressRange_v2, (CUdeviceptr * pbase, std::size_t * psize, CUdeviceptr dptr))       \
  X(cuMemcpyHtoD_v2, (CUdeviceptr dstDevice, const void* srcHost, std::size_t ByteCount))        \
  X(cuMemcpyDtoH_v2, (void* dstHost, CUdeviceptr srcDevice, std::size_t ByteCount))              \
  X(cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, std::size_t N))                     \
  X(cuStreamCreate, (CUstream * phStream, unsigned int flags))                                   \
  X(cuStreamDestroy_v2, (CUstream hStream))                                                      \
  X(cuEventCreate, (CUevent * phEvent, unsigned int flags))                                      \
  X(cuEventRecord, (CUevent hEvent, CUstream hStream))                                           \
  X(cuEventDestroy_v2, (CUevent hEvent))                                                         \
  X(cuEventQuery, (CUevent hEvent))                                                              \
  X(cuEventElapsedTime, (float* pMilliseconds, CUevent hStart, CUevent hEnd))                    \
  X(cuStreamQuery, (CUstream hStream))                                                           \
  X(cuStreamWaitEvent, (CUstream hStream, CUevent hEvent, unsigned int flags))                   \
  X(cuStreamBeginCapture_v2, (CUstream hStream, int mode))                                       \
  X(cuStreamEndCapture, (CUstream hStream, CUgraph * phGraph))                                   \
  X(cuStreamIsCapturing, (CUstream hStream, int* captureStatus))                                 \
  X(cuStreamIsCapturing_ptsz, (CUstream hStream, int* captureStatus))                            \
  X(cuModuleLoadData, (CUmodule * module, const void* image))                                    \
  X(cuModuleGetFunction, (CUfunction * hfunc, CUmodule hmod, const char* name))                  \
  X(cuModuleUnload, (CUmodule hmod))                                                             \
  X(cuGraphCreate, (CUgraph * phGraph, unsigned int flags))                                      \
  X(cuGraphInstantiateWithFlags,                                                                 \
    (CUgraphExec * phGraphExec, CUgraph hGraph, unsigned long long flags))                       \
  X(cuGraphExecDestroy, (CUgraphExec hGraphExec))                                                \
  X(cuGraphDestroy, (CUgraph hGraph))                                                            \
  X(cuGetErrorString, (CUresult error, const char** pStr))                                       \
  X(cuGetErrorName, (CUresult error, const char** pStr))

#define TESSERA_DECLARE_PFN(name, params) using PFN_##name = CUresult(*) params;
TESSERA_CUDA_HOOKED(TESSERA_DECLARE_PFN)
TESSERA_CUDA_PASSTHROUGH(TESSERA_DECLARE_PFN)
#undef TESSERA_DECLARE_PFN

}  // namespace tessera::abi
