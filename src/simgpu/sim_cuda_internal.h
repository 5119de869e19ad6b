// Internal to the simulated CUDA driver (sim_cuda*.cpp): what its files share.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/immortal.h"
#include "common/log.h"
#include "cuda_abi/cuda_abi.h"
#include "simgpu/sim_driver.h"
#include "simgpu/sim_export.h"
#include "simgpu/sim_machine.h"

using namespace tessera::abi;
using tessera::Immortal;
using tessera::kMostDevices;
using tessera::LogLevel;
using tessera::monotonic_ns;
using tessera::sleep_until_ns;

namespace tessera::sim {

inline constexpr std::uint64_t kAllocationUnit = 512;
inline constexpr std::uint64_t kPoolChunk = 2ull << 20;
inline constexpr std::uint64_t kVmmGranularity = 2ull << 20;
inline constexpr std::uint64_t kArraySizeUnit = 64ull << 10;
inline constexpr std::uint64_t kSmallAllocation = 64ull << 10;

std::uint64_t round_up(std::uint64_t value, std::uint64_t unit);

extern thread_local Context* current_context;
extern thread_local Context* context_stack[16];
extern thread_local int context_depth;

Driver& driver();

// Holds driver_lock for its scope, and reaches the driver's state through it.
class SCOPED_CAPABILITY Lock {
 public:
  Lock() ACQUIRE(driver_lock) : driver_(driver()) { driver_lock.lock(); }
  ~Lock() RELEASE() { driver_lock.unlock(); }
  Driver* operator->() { return &driver_; }

 private:
  Driver& driver_;
};

CUresult require_initialized();

CUresult require_context(Context*& context);

CUresult machine_device(CUdevice ordinal, int& index);

// A simulated device's spec, as this process's driver enumerated it.
const DeviceSpec& spec_of(int device);

// Takes device memory for this process: refused when an MPS client's daemon has gone, or
// past its pinned-memory limit on that device, or when the device is full.
CUresult take_device_memory(int device, std::uint64_t bytes);

void unmap_host(void* memory, std::uint64_t bytes, bool mapped);

// At a synchronisation point pools give back what they hold above their release threshold.
void release_pools_on_sync();

CUresult destroy_array(std::uint64_t handle);

}  // namespace tessera::sim

// Every entry point, for those that call others and for cuGetProcAddress's table.
SIM_EXPORT CUresult cuInit(unsigned int flags);
SIM_EXPORT CUresult cuDriverGetVersion(int* version);
SIM_EXPORT CUresult cuDeviceGetCount(int* count);
SIM_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal);
SIM_EXPORT CUresult cuDeviceGetName(char* name, int length, CUdevice ordinal);
SIM_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice ordinal);
SIM_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice ordinal);
SIM_EXPORT CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice ordinal);
SIM_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice ordinal);
SIM_EXPORT CUresult cuDeviceGetPCIBusId(char* bus_id, int length, CUdevice ordinal);
SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice ordinal);
SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam_st* params, int count,
                                   unsigned int flags, CUdevice ordinal);
SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams_st* params,
                                   unsigned int flags, CUdevice ordinal);
SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx);
SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx);
SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx);
SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx);
SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx);
SIM_EXPORT CUresult cuCtxGetDevice(CUdevice* device);
SIM_EXPORT CUresult cuCtxSynchronize();
SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice ordinal);
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice ordinal);
SIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice ordinal);
SIM_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total);
SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t bytes);
SIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, std::size_t* pitch, std::size_t width,
                                       std::size_t height, unsigned int element_bytes);
SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, std::size_t bytes, unsigned int flags);
SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr);
SIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size, CUdeviceptr dptr);
SIM_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t bytes);
SIM_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t bytes);
SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, std::size_t count);
SIM_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice ordinal);
SIM_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice ordinal);
SIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice ordinal, CUmemoryPool handle);
SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* handle, const CUmemPoolProps* props);
SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool handle);
SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool handle, std::size_t keep);
SIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool handle, int attribute, void* value);
SIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool handle, int attribute, void* value);
SIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, std::size_t bytes, CUstream stream);
SIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes, CUstream stream);
SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, std::size_t bytes, CUmemoryPool pool,
                                            CUstream);
SIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes,
                                                 CUmemoryPool pool, CUstream stream);
SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream);
SIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream);
SIM_EXPORT CUresult cuStreamCreate(CUstream* handle, unsigned int);
SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream handle);
SIM_EXPORT CUresult cuStreamSynchronize(CUstream handle);
SIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream handle);
SIM_EXPORT CUresult cuStreamQuery(CUstream handle);
SIM_EXPORT CUresult cuStreamWaitEvent(CUstream handle, CUevent handle_event, unsigned int);
SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream handle, int);
SIM_EXPORT CUresult cuStreamEndCapture(CUstream handle, CUgraph* graph);
SIM_EXPORT CUresult cuStreamIsCapturing(CUstream handle, int* status);
SIM_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream handle, int* status);
SIM_EXPORT CUresult cuEventCreate(CUevent* handle, unsigned int);
SIM_EXPORT CUresult cuEventRecord(CUevent handle, CUstream handle_stream);
SIM_EXPORT CUresult cuEventQuery(CUevent handle);
SIM_EXPORT CUresult cuEventSynchronize(CUevent handle);
SIM_EXPORT CUresult cuEventElapsedTime(float* milliseconds, CUevent start, CUevent end);
SIM_EXPORT CUresult cuEventDestroy_v2(CUevent handle);
SIM_EXPORT CUresult cuMemGetAllocationGranularity(std::size_t* granularity,
                                                  const CUmemAllocationProp* prop, int option);
SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size,
                                const CUmemAllocationProp* prop, unsigned long long flags);
SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                                        CUdeviceptr, unsigned long long flags);
SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, std::size_t size);
SIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags);
SIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, std::size_t size);
SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                                   std::size_t count);
SIM_EXPORT CUresult cuMemExportToShareableHandle(void* shareable,
                                                 CUmemGenericAllocationHandle handle, int type,
                                                 unsigned long long);
SIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                   void* os_handle, int type);
SIM_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                           CUmemGenericAllocationHandle handle);
SIM_EXPORT CUresult cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc);
SIM_EXPORT CUresult cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc);
SIM_EXPORT CUresult cuArrayDestroy(CUarray handle);
SIM_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* handle,
                                           const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned levels);
SIM_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray handle);
SIM_EXPORT CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* requirements,
                                                 CUarray handle, CUdevice);
SIM_EXPORT CUresult cuMipmappedArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS* requirements, CUmipmappedArray handle, CUdevice);
SIM_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image);
SIM_EXPORT CUresult cuModuleGetFunction(CUfunction* handle, CUmodule module, const char* name);
SIM_EXPORT CUresult cuModuleUnload(CUmodule module);
SIM_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned, CUstream stream, void**,
                                   void**);
SIM_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, unsigned,
                                        CUstream stream, void**, void**);
SIM_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void**, void**);
SIM_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** p,
                                          void** e);
SIM_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                              unsigned bx, unsigned by, unsigned bz, unsigned,
                                              CUstream stream, void**);
SIM_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                   unsigned gz, unsigned bx, unsigned by,
                                                   unsigned bz, unsigned, CUstream stream, void**);
SIM_EXPORT CUresult cuLaunchHostFunc(CUstream handle, CUhostFn fn, void* user_data);
SIM_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void* user_data);
SIM_EXPORT CUresult cuGraphCreate(CUgraph* graph, unsigned int flags);
SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph handle,
                                                unsigned long long);
SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec handle, CUstream stream_handle);
SIM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);
SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec handle);
SIM_EXPORT CUresult cuGraphDestroy(CUgraph handle);
SIM_EXPORT CUresult cuGetErrorName(CUresult code, const char** name);
SIM_EXPORT CUresult cuGetErrorString(CUresult code, const char** text);
