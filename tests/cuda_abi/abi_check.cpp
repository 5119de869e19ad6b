// Tessera declares the driver ABI it uses itself (src/cuda_abi) so that it builds without
// the CUDA toolkit. Where the toolkit's headers are installed, this compares every
// declaration with NVIDIA's: struct layouts, constants, and each entry point's signature
// against the versioned PFN_* typedef in cudaTypedefs.h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <type_traits>

#include "cuda_abi/cuda_abi.h"  // first: NVIDIA's headers define macros over these names
#include "cuda_abi/nvml_abi.h"

namespace {

namespace t = tessera::abi;

template <typename T, typename = void>
struct IsComplete : std::false_type {};
template <typename T>
struct IsComplete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

template <typename A, typename B>
constexpr bool compatible();

template <typename F, typename G>
struct FunctionsCompatible : std::false_type {};
template <typename R, typename... A, typename S, typename... B>
struct FunctionsCompatible<R(A...), S(B...)> {
  static constexpr bool value = [] {
    if constexpr (sizeof...(A) != sizeof...(B)) {
      return false;
    } else {
      return compatible<R, S>() && (compatible<A, B>() && ...);
    }
  }();
};

// Same machine-level meaning: identical, or pointers to compatible things, or integers and
// enums of one size, or structs of one size and alignment, or a type Tessera keeps opaque.
template <typename A, typename B>
constexpr bool compatible() {
  if constexpr (std::is_same_v<A, B>) {
    return true;
  } else if constexpr (std::is_const_v<A> || std::is_const_v<B>) {
    return std::is_const_v<A> == std::is_const_v<B> &&
           compatible<std::remove_const_t<A>, std::remove_const_t<B>>();
  } else if constexpr (std::is_pointer_v<A> && std::is_pointer_v<B>) {
    return compatible<std::remove_pointer_t<A>, std::remove_pointer_t<B>>();
  } else if constexpr (std::is_function_v<A> && std::is_function_v<B>) {
    return FunctionsCompatible<A, B>::value;
  } else if constexpr ((std::is_integral_v<A> || std::is_enum_v<A>)&&(std::is_integral_v<B> ||
                                                                      std::is_enum_v<B>)) {
    return sizeof(A) == sizeof(B);
  } else if constexpr (std::is_void_v<A> || std::is_void_v<B>) {
    return false;
  } else if constexpr (!IsComplete<A>::value) {
    return std::is_class_v<B>;  // a type Tessera keeps opaque: only ever behind a pointer
  } else if constexpr (IsComplete<A>::value && IsComplete<B>::value) {
    return sizeof(A) == sizeof(B) && alignof(A) == alignof(B);
  } else {
    return false;
  }
}

#define SIGNATURE(ours, theirs) \
  EXPECT_TRUE((compatible<t::PFN_##ours, ::theirs>())) << #ours " differs from " #theirs

TEST(AbiCheck, EntryPointsMatchNvidiasTypedefs) {
  SIGNATURE(cuInit, PFN_cuInit_v2000);
  SIGNATURE(cuGetProcAddress, PFN_cuGetProcAddress_v11030);
  SIGNATURE(cuGetProcAddress_v2, PFN_cuGetProcAddress_v12000);
  SIGNATURE(cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020);
  SIGNATURE(cuDeviceTotalMem_v2, PFN_cuDeviceTotalMem_v3020);
  SIGNATURE(cuMemAlloc_v2, PFN_cuMemAlloc_v3020);
  SIGNATURE(cuMemAllocPitch_v2, PFN_cuMemAllocPitch_v3020);
  SIGNATURE(cuMemAllocManaged, PFN_cuMemAllocManaged_v6000);
  SIGNATURE(cuMemFree_v2, PFN_cuMemFree_v3020);
  SIGNATURE(cuMemAllocAsync, PFN_cuMemAllocAsync_v11020);
  SIGNATURE(cuMemAllocAsync_ptsz, PFN_cuMemAllocAsync_v11020_ptsz);
  SIGNATURE(cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020);
  SIGNATURE(cuMemAllocFromPoolAsync_ptsz, PFN_cuMemAllocFromPoolAsync_v11020_ptsz);
  SIGNATURE(cuMemFreeAsync, PFN_cuMemFreeAsync_v11020);
  SIGNATURE(cuMemFreeAsync_ptsz, PFN_cuMemFreeAsync_v11020_ptsz);
  SIGNATURE(cuMemPoolTrimTo, PFN_cuMemPoolTrimTo_v11020);
  SIGNATURE(cuMemPoolSetAttribute, PFN_cuMemPoolSetAttribute_v11020);
  SIGNATURE(cuMemPoolDestroy, PFN_cuMemPoolDestroy_v11020);
  SIGNATURE(cuStreamSynchronize, PFN_cuStreamSynchronize_v2000);
  SIGNATURE(cuStreamSynchronize_ptsz, PFN_cuStreamSynchronize_v7000_ptsz);
  SIGNATURE(cuEventSynchronize, PFN_cuEventSynchronize_v2000);
  SIGNATURE(cuCtxSynchronize, PFN_cuCtxSynchronize_v2000);
  SIGNATURE(cuMemCreate, PFN_cuMemCreate_v10020);
  SIGNATURE(cuMemRelease, PFN_cuMemRelease_v10020);
  SIGNATURE(cuMemMap, PFN_cuMemMap_v10020);
  SIGNATURE(cuMemUnmap, PFN_cuMemUnmap_v10020);
  SIGNATURE(cuMemImportFromShareableHandle, PFN_cuMemImportFromShareableHandle_v10020);
  SIGNATURE(cuArrayCreate_v2, PFN_cuArrayCreate_v3020);
  SIGNATURE(cuArray3DCreate_v2, PFN_cuArray3DCreate_v3020);
  SIGNATURE(cuArrayDestroy, PFN_cuArrayDestroy_v2000);
  SIGNATURE(cuMipmappedArrayCreate, PFN_cuMipmappedArrayCreate_v5000);
  SIGNATURE(cuMipmappedArrayDestroy, PFN_cuMipmappedArrayDestroy_v5000);
  SIGNATURE(cuCtxCreate_v2, PFN_cuCtxCreate_v3020);
  SIGNATURE(cuCtxCreate_v3, PFN_cuCtxCreate_v11040);
  SIGNATURE(cuCtxCreate_v4, PFN_cuCtxCreate_v12050);
  SIGNATURE(cuCtxDestroy_v2, PFN_cuCtxDestroy_v4000);
  SIGNATURE(cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000);
  SIGNATURE(cuDevicePrimaryCtxRelease_v2, PFN_cuDevicePrimaryCtxRelease_v11000);
  SIGNATURE(cuDevicePrimaryCtxReset_v2, PFN_cuDevicePrimaryCtxReset_v11000);
  SIGNATURE(cuLaunchKernel, PFN_cuLaunchKernel_v4000);
  SIGNATURE(cuLaunchKernel_ptsz, PFN_cuLaunchKernel_v7000_ptsz);
  SIGNATURE(cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060);
  SIGNATURE(cuLaunchKernelEx_ptsz, PFN_cuLaunchKernelEx_v11060_ptsz);
  SIGNATURE(cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000);
  SIGNATURE(cuLaunchCooperativeKernel_ptsz, PFN_cuLaunchCooperativeKernel_v9000_ptsz);
  SIGNATURE(cuGraphLaunch, PFN_cuGraphLaunch_v10000);
  SIGNATURE(cuGraphLaunch_ptsz, PFN_cuGraphLaunch_v10000_ptsz);
  SIGNATURE(cuLaunchHostFunc, PFN_cuLaunchHostFunc_v10000);
  SIGNATURE(cuLaunchHostFunc_ptsz, PFN_cuLaunchHostFunc_v10000_ptsz);
  SIGNATURE(cuDriverGetVersion, PFN_cuDriverGetVersion_v2020);
  SIGNATURE(cuDeviceGet, PFN_cuDeviceGet_v2000);
  SIGNATURE(cuDeviceGetCount, PFN_cuDeviceGetCount_v2000);
  SIGNATURE(cuDeviceGetName, PFN_cuDeviceGetName_v2000);
  SIGNATURE(cuDeviceGetUuid, PFN_cuDeviceGetUuid_v9020);
  SIGNATURE(cuDeviceGetUuid_v2, PFN_cuDeviceGetUuid_v11040);
  SIGNATURE(cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000);
  SIGNATURE(cuDeviceGetPCIBusId, PFN_cuDeviceGetPCIBusId_v4010);
  SIGNATURE(cuCtxGetDevice, PFN_cuCtxGetDevice_v2000);
  SIGNATURE(cuCtxGetCurrent, PFN_cuCtxGetCurrent_v4000);
  SIGNATURE(cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000);
  SIGNATURE(cuCtxPushCurrent_v2, PFN_cuCtxPushCurrent_v4000);
  SIGNATURE(cuCtxPopCurrent_v2, PFN_cuCtxPopCurrent_v4000);
  SIGNATURE(cuDeviceGetMemPool, PFN_cuDeviceGetMemPool_v11020);
  SIGNATURE(cuDeviceGetDefaultMemPool, PFN_cuDeviceGetDefaultMemPool_v11020);
  SIGNATURE(cuDeviceSetMemPool, PFN_cuDeviceSetMemPool_v11020);
  SIGNATURE(cuMemPoolCreate, PFN_cuMemPoolCreate_v11020);
  SIGNATURE(cuMemPoolGetAttribute, PFN_cuMemPoolGetAttribute_v11020);
  SIGNATURE(cuMemGetAllocationGranularity, PFN_cuMemGetAllocationGranularity_v10020);
  SIGNATURE(cuMemAddressReserve, PFN_cuMemAddressReserve_v10020);
  SIGNATURE(cuMemAddressFree, PFN_cuMemAddressFree_v10020);
  SIGNATURE(cuMemSetAccess, PFN_cuMemSetAccess_v10020);
  SIGNATURE(cuMemExportToShareableHandle, PFN_cuMemExportToShareableHandle_v10020);
  SIGNATURE(cuMemGetAllocationPropertiesFromHandle,
            PFN_cuMemGetAllocationPropertiesFromHandle_v10020);
  SIGNATURE(cuArrayGetMemoryRequirements, PFN_cuArrayGetMemoryRequirements_v11060);
  SIGNATURE(cuMipmappedArrayGetMemoryRequirements,
            PFN_cuMipmappedArrayGetMemoryRequirements_v11060);
  SIGNATURE(cuMemGetAddressRange_v2, PFN_cuMemGetAddressRange_v3020);
  SIGNATURE(cuMemcpyHtoD_v2, PFN_cuMemcpyHtoD_v3020);
  SIGNATURE(cuMemcpyDtoH_v2, PFN_cuMemcpyDtoH_v3020);
  SIGNATURE(cuMemsetD8_v2, PFN_cuMemsetD8_v3020);
  SIGNATURE(cuStreamCreate, PFN_cuStreamCreate_v2000);
  SIGNATURE(cuStreamDestroy_v2, PFN_cuStreamDestroy_v4000);
  SIGNATURE(cuEventCreate, PFN_cuEventCreate_v2000);
  SIGNATURE(cuEventRecord, PFN_cuEventRecord_v2000);
  SIGNATURE(cuEventDestroy_v2, PFN_cuEventDestroy_v4000);
  SIGNATURE(cuEventQuery, PFN_cuEventQuery_v2000);
  SIGNATURE(cuEventElapsedTime, PFN_cuEventElapsedTime_v2000);
  SIGNATURE(cuStreamQuery, PFN_cuStreamQuery_v2000);
  SIGNATURE(cuStreamWaitEvent, PFN_cuStreamWaitEvent_v3020);
  SIGNATURE(cuStreamBeginCapture_v2, PFN_cuStreamBeginCapture_v10010);
  SIGNATURE(cuStreamEndCapture, PFN_cuStreamEndCapture_v10000);
  SIGNATURE(cuStreamIsCapturing, PFN_cuStreamIsCapturing_v10000);
  SIGNATURE(cuStreamIsCapturing_ptsz, PFN_cuStreamIsCapturing_v10000_ptsz);
  SIGNATURE(cuModuleLoadData, PFN_cuModuleLoadData_v2000);
  SIGNATURE(cuModuleGetFunction, PFN_cuModuleGetFunction_v2000);
  SIGNATURE(cuModuleUnload, PFN_cuModuleUnload_v2000);
  SIGNATURE(cuGraphCreate, PFN_cuGraphCreate_v10000);
  SIGNATURE(cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040);
  SIGNATURE(cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000);
  SIGNATURE(cuGraphDestroy, PFN_cuGraphDestroy_v10000);
  SIGNATURE(cuGetErrorString, PFN_cuGetErrorString_v6000);
  SIGNATURE(cuGetErrorName, PFN_cuGetErrorName_v6000);
}

#define SAME_LAYOUT(ours, theirs)                                \
  EXPECT_EQ(sizeof(t::ours), sizeof(::theirs)) << #ours " size"; \
  EXPECT_EQ(alignof(t::ours), alignof(::theirs)) << #ours " alignment"
#define SAME_OFFSET(ours, theirs, field) \
  EXPECT_EQ(offsetof(t::ours, field), offsetof(::theirs, field)) << #ours "." #field

TEST(AbiCheck, StructLayoutsMatch) {
  SAME_LAYOUT(CUuuid, CUuuid);
  SAME_LAYOUT(CUmemLocation, CUmemLocation);
  SAME_OFFSET(CUmemLocation, CUmemLocation, id);
  SAME_LAYOUT(CUmemAllocationProp, CUmemAllocationProp);
  SAME_OFFSET(CUmemAllocationProp, CUmemAllocationProp, requestedHandleTypes);
  SAME_OFFSET(CUmemAllocationProp, CUmemAllocationProp, location);
  SAME_OFFSET(CUmemAllocationProp, CUmemAllocationProp, win32HandleMetaData);
  SAME_OFFSET(CUmemAllocationProp, CUmemAllocationProp, allocFlags);
  SAME_LAYOUT(CUmemAccessDesc, CUmemAccessDesc);
  SAME_OFFSET(CUmemAccessDesc, CUmemAccessDesc, flags);
  SAME_LAYOUT(CUmemPoolProps, CUmemPoolProps);
  SAME_OFFSET(CUmemPoolProps, CUmemPoolProps, location);
  SAME_OFFSET(CUmemPoolProps, CUmemPoolProps, maxSize);
  SAME_OFFSET(CUmemPoolProps, CUmemPoolProps, usage);
  SAME_LAYOUT(CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR);
  SAME_OFFSET(CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR, Format);
  SAME_OFFSET(CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY_DESCRIPTOR, NumChannels);
  SAME_LAYOUT(CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR);
  SAME_OFFSET(CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, Depth);
  SAME_OFFSET(CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, Flags);
  SAME_LAYOUT(CUDA_ARRAY_MEMORY_REQUIREMENTS, CUDA_ARRAY_MEMORY_REQUIREMENTS);
  SAME_OFFSET(CUDA_ARRAY_MEMORY_REQUIREMENTS, CUDA_ARRAY_MEMORY_REQUIREMENTS, alignment);
  SAME_LAYOUT(CUlaunchConfig, CUlaunchConfig);
  SAME_OFFSET(CUlaunchConfig, CUlaunchConfig, hStream);
  SAME_OFFSET(CUlaunchConfig, CUlaunchConfig, attrs);
  SAME_OFFSET(CUlaunchConfig, CUlaunchConfig, numAttrs);
}

TEST(AbiCheck, ConstantsMatch) {
  EXPECT_EQ(t::CUDA_ERROR_INVALID_VALUE, ::CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(t::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, ::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(t::CUDA_ERROR_MPS_CONNECTION_FAILED, ::CUDA_ERROR_MPS_CONNECTION_FAILED);
  EXPECT_EQ(t::CUDA_ERROR_MPS_RPC_FAILURE, ::CUDA_ERROR_MPS_RPC_FAILURE);
  EXPECT_EQ(t::CUDA_ERROR_CAPTURED_EVENT, ::CUDA_ERROR_CAPTURED_EVENT);
  EXPECT_EQ(t::CU_STREAM_CAPTURE_STATUS_NONE, ::CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(t::CU_STREAM_CAPTURE_STATUS_ACTIVE, ::CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(t::CU_STREAM_CAPTURE_STATUS_INVALIDATED, ::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  EXPECT_EQ(t::CUDA_ERROR_OUT_OF_MEMORY, ::CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(t::CUDA_ERROR_NOT_INITIALIZED, ::CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(t::CUDA_ERROR_NO_DEVICE, ::CUDA_ERROR_NO_DEVICE);
  EXPECT_EQ(t::CUDA_ERROR_INVALID_DEVICE, ::CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(t::CUDA_ERROR_INVALID_CONTEXT, ::CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(t::CUDA_ERROR_INVALID_HANDLE, ::CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(t::CUDA_ERROR_NOT_FOUND, ::CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(t::CUDA_ERROR_NOT_SUPPORTED, ::CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(t::CUDA_ERROR_NOT_READY, ::CUDA_ERROR_NOT_READY);
  EXPECT_EQ(t::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, ::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(t::CUDA_ERROR_UNKNOWN, ::CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            ::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            ::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_WARP_SIZE, ::CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, ::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, ::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
            ::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, ::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            ::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            ::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
            ::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            ::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  EXPECT_EQ(t::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            ::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
  EXPECT_EQ(t::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
            static_cast<t::cuuint64_t>(::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
  EXPECT_EQ(t::CU_GET_PROC_ADDRESS_LEGACY_STREAM,
            static_cast<t::cuuint64_t>(::CU_GET_PROC_ADDRESS_LEGACY_STREAM));
  EXPECT_EQ(t::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, ::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(t::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            ::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(t::CU_MEM_LOCATION_TYPE_DEVICE, ::CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(t::CU_MEM_LOCATION_TYPE_HOST, ::CU_MEM_LOCATION_TYPE_HOST);
  EXPECT_EQ(t::CU_MEM_LOCATION_TYPE_HOST_NUMA, ::CU_MEM_LOCATION_TYPE_HOST_NUMA);
  EXPECT_EQ(t::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, ::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT);
  EXPECT_EQ(t::CU_MEM_ALLOCATION_TYPE_PINNED, ::CU_MEM_ALLOCATION_TYPE_PINNED);
  EXPECT_EQ(t::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            ::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(t::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, ::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  EXPECT_EQ(t::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, ::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
  EXPECT_EQ(t::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, ::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  EXPECT_EQ(t::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, ::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
  EXPECT_EQ(t::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, ::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  EXPECT_EQ(t::CU_MEMPOOL_ATTR_USED_MEM_HIGH, ::CU_MEMPOOL_ATTR_USED_MEM_HIGH);
  EXPECT_EQ(t::CU_AD_FORMAT_UNSIGNED_INT8, ::CU_AD_FORMAT_UNSIGNED_INT8);
  EXPECT_EQ(t::CU_AD_FORMAT_SIGNED_INT8, ::CU_AD_FORMAT_SIGNED_INT8);
  EXPECT_EQ(t::CU_AD_FORMAT_HALF, ::CU_AD_FORMAT_HALF);
  EXPECT_EQ(t::CU_AD_FORMAT_FLOAT, ::CU_AD_FORMAT_FLOAT);
  EXPECT_EQ(t::CU_AD_FORMAT_SIGNED_INT32, ::CU_AD_FORMAT_SIGNED_INT32);
  EXPECT_EQ(static_cast<int>(t::CU_MEM_ATTACH_GLOBAL), static_cast<int>(::CU_MEM_ATTACH_GLOBAL));
}

// NVML: nvml.h ships with the driver's development files (and some toolkits); where it is
// installed, the slice Tessera declares in nvml_abi.h is checked against it too.
#if __has_include(<nvml.h>)
// Ours, read before nvml.h, which defines several of these names as macros.
constexpr unsigned kOurMemoryV2 = t::nvmlMemory_v2;
constexpr unsigned long long kOurXid = t::nvmlEventTypeXidCriticalError;
constexpr unsigned long long kOurDoubleBit = t::nvmlEventTypeDoubleBitEccError;
constexpr unsigned long long kOurSingleBit = t::nvmlEventTypeSingleBitEccError;
constexpr unsigned kOurMigEnable = t::NVML_DEVICE_MIG_ENABLE;
constexpr unsigned kOurProfileInfoV2 = t::nvmlGpuInstanceProfileInfo_v2;
constexpr unsigned kOurComputeProfileInfoV2 = t::nvmlComputeInstanceProfileInfo_v2;
constexpr unsigned kOurSharedEngines = t::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED;
}  // namespace
#include <nvml.h>
namespace {

#define NVML_SIGNATURE(ours, theirs)                                       \
  EXPECT_TRUE((compatible<t::PFN_##ours, decltype(&::theirs)>())) << #ours \
      " differs "                                                          \
      "from " #theirs

TEST(AbiCheck, NvmlEntryPointsStructsAndConstantsMatchNvidias) {
  NVML_SIGNATURE(nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo);
  NVML_SIGNATURE(nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetMemoryInfo_v2);
  NVML_SIGNATURE(nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetComputeRunningProcesses_v3);
  NVML_SIGNATURE(nvmlInit_v2, nvmlInit_v2);
  NVML_SIGNATURE(nvmlSystemGetDriverVersion, nvmlSystemGetDriverVersion);
  NVML_SIGNATURE(nvmlDeviceGetCount_v2, nvmlDeviceGetCount_v2);
  NVML_SIGNATURE(nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetHandleByIndex_v2);
  NVML_SIGNATURE(nvmlDeviceGetHandleByUUID, nvmlDeviceGetHandleByUUID);
  NVML_SIGNATURE(nvmlDeviceGetName, nvmlDeviceGetName);
  NVML_SIGNATURE(nvmlDeviceGetUUID, nvmlDeviceGetUUID);
  NVML_SIGNATURE(nvmlSystemGetCudaDriverVersion_v2, nvmlSystemGetCudaDriverVersion_v2);
  NVML_SIGNATURE(nvmlDeviceGetCudaComputeCapability, nvmlDeviceGetCudaComputeCapability);
  NVML_SIGNATURE(nvmlDeviceGetPciInfo_v3, nvmlDeviceGetPciInfo_v3);
  NVML_SIGNATURE(nvmlDeviceGetMigMode, nvmlDeviceGetMigMode);
  NVML_SIGNATURE(nvmlDeviceGetAttributes_v2, nvmlDeviceGetAttributes_v2);
  NVML_SIGNATURE(nvmlEventSetCreate, nvmlEventSetCreate);
  NVML_SIGNATURE(nvmlDeviceGetSupportedEventTypes, nvmlDeviceGetSupportedEventTypes);
  NVML_SIGNATURE(nvmlDeviceRegisterEvents, nvmlDeviceRegisterEvents);
  NVML_SIGNATURE(nvmlEventSetWait_v2, nvmlEventSetWait_v2);
  NVML_SIGNATURE(nvmlEventSetFree, nvmlEventSetFree);
  EXPECT_EQ(sizeof(t::nvmlPciInfo_t), sizeof(::nvmlPciInfo_t));
  EXPECT_EQ(offsetof(t::nvmlPciInfo_t, busId), offsetof(::nvmlPciInfo_t, busId));
  EXPECT_EQ(sizeof(t::nvmlDeviceAttributes_t), sizeof(::nvmlDeviceAttributes_t));
  EXPECT_EQ(offsetof(t::nvmlDeviceAttributes_t, memorySizeMB),
            offsetof(::nvmlDeviceAttributes_t, memorySizeMB));
  EXPECT_EQ(sizeof(t::nvmlEventData_t), sizeof(::nvmlEventData_t));
  EXPECT_EQ(offsetof(t::nvmlEventData_t, eventData), offsetof(::nvmlEventData_t, eventData));
  EXPECT_EQ(offsetof(t::nvmlEventData_t, computeInstanceId),
            offsetof(::nvmlEventData_t, computeInstanceId));
  EXPECT_EQ(sizeof(t::nvmlMemory_v2_t), sizeof(::nvmlMemory_v2_t));
  EXPECT_EQ(kOurMemoryV2, static_cast<unsigned>(nvmlMemory_v2));
  EXPECT_EQ(kOurXid, static_cast<unsigned long long>(nvmlEventTypeXidCriticalError));
  EXPECT_EQ(kOurDoubleBit, static_cast<unsigned long long>(nvmlEventTypeDoubleBitEccError));
  EXPECT_EQ(kOurSingleBit, static_cast<unsigned long long>(nvmlEventTypeSingleBitEccError));
  EXPECT_EQ(t::NVML_ERROR_TIMEOUT, ::NVML_ERROR_TIMEOUT);
  EXPECT_EQ(t::NVML_ERROR_GPU_IS_LOST, ::NVML_ERROR_GPU_IS_LOST);
  EXPECT_EQ(t::NVML_ERROR_NOT_FOUND, ::NVML_ERROR_NOT_FOUND);
  EXPECT_EQ(kOurMigEnable, static_cast<unsigned>(NVML_DEVICE_MIG_ENABLE));
  NVML_SIGNATURE(nvmlDeviceGetGpuInstanceProfileInfoV, nvmlDeviceGetGpuInstanceProfileInfoV);
  NVML_SIGNATURE(nvmlDeviceGetGpuInstancePossiblePlacements_v2,
                 nvmlDeviceGetGpuInstancePossiblePlacements_v2);
  EXPECT_EQ(sizeof(t::nvmlGpuInstanceProfileInfo_v2_t), sizeof(::nvmlGpuInstanceProfileInfo_v2_t));
  EXPECT_EQ(offsetof(t::nvmlGpuInstanceProfileInfo_v2_t, memorySizeMB),
            offsetof(::nvmlGpuInstanceProfileInfo_v2_t, memorySizeMB));
  EXPECT_EQ(offsetof(t::nvmlGpuInstanceProfileInfo_v2_t, name),
            offsetof(::nvmlGpuInstanceProfileInfo_v2_t, name));
  EXPECT_EQ(kOurProfileInfoV2, static_cast<unsigned>(nvmlGpuInstanceProfileInfo_v2));
  EXPECT_EQ(sizeof(t::nvmlGpuInstancePlacement_t), sizeof(::nvmlGpuInstancePlacement_t));
#define NVML_MIG_SIGNATURE(name, params) NVML_SIGNATURE(name, name);
  TESSERA_NVML_MIG(NVML_MIG_SIGNATURE)
#undef NVML_MIG_SIGNATURE
  EXPECT_EQ(sizeof(t::nvmlGpuInstanceInfo_t), sizeof(::nvmlGpuInstanceInfo_t));
  EXPECT_EQ(offsetof(t::nvmlGpuInstanceInfo_t, placement),
            offsetof(::nvmlGpuInstanceInfo_t, placement));
  EXPECT_EQ(sizeof(t::nvmlComputeInstanceInfo_t), sizeof(::nvmlComputeInstanceInfo_t));
  EXPECT_EQ(offsetof(t::nvmlComputeInstanceInfo_t, placement),
            offsetof(::nvmlComputeInstanceInfo_t, placement));
  EXPECT_EQ(sizeof(t::nvmlComputeInstanceProfileInfo_v2_t),
            sizeof(::nvmlComputeInstanceProfileInfo_v2_t));
  EXPECT_EQ(kOurComputeProfileInfoV2, static_cast<unsigned>(nvmlComputeInstanceProfileInfo_v2));
  EXPECT_EQ(t::NVML_ERROR_RESET_REQUIRED, ::NVML_ERROR_RESET_REQUIRED);
  EXPECT_EQ(t::NVML_ERROR_IN_USE, ::NVML_ERROR_IN_USE);
  EXPECT_EQ(t::NVML_ERROR_INSUFFICIENT_RESOURCES, ::NVML_ERROR_INSUFFICIENT_RESOURCES);
  EXPECT_EQ(t::NVML_ERROR_INVALID_STATE, ::NVML_ERROR_INVALID_STATE);
  EXPECT_EQ(kOurSharedEngines, static_cast<unsigned>(NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED));
}
#endif

}  // namespace
