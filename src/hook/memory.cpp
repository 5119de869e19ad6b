// Device-memory quota: every entry point that takes device memory charges the group ledger
// before the driver is asked, and every one that gives memory back returns exactly what was
// charged. Where the driver decides the real size (pitch, arrays, pool growth), an estimate
// is charged first and reconciled with what the driver reports afterwards; if the real size
// does not fit, the allocation is undone and the caller gets CUDA_ERROR_OUT_OF_MEMORY.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "common/units.h"
#include "hook/hook.h"

using namespace tessera::abi;
using namespace tessera::hook;

namespace tessera::hook {
namespace {

// Linear allocations take device memory in units of this size.
constexpr std::uint64_t kAllocationUnit = 512;
// Upper bound on how much a pool grows to serve one request beyond the request itself.
constexpr std::uint64_t kPoolGrowthUnit = 2ull << 20;

std::uint64_t round_up(std::uint64_t value, std::uint64_t unit) {
  return (value + unit - 1) / unit * unit;
}

CUcontext current_context() {
  CUcontext context = nullptr;
  hook().real.cuCtxGetCurrent(&context);
  return context;
}

// Charges `bytes`, runs the driver call, and keeps the charge only if it succeeded.
template <typename Allocate>
CUresult charged_call(int device, std::uint64_t bytes, Allocate allocate) {
  if (!charge(device, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult result = allocate();
  if (result != CUDA_SUCCESS) uncharge(device, bytes);
  return result;
}

// Moves a handle's charge from `estimate` to `actual`; false (nothing charged) if the
// actual size does not fit.
bool settle_charge(int device, std::uint64_t estimate, std::uint64_t actual) {
  if (actual > estimate) {
    if (!charge(device, actual - estimate)) {
      uncharge(device, estimate);
      return false;
    }
  } else {
    uncharge(device, estimate - actual);
  }
  return true;
}

// One of the Hook's tables of charges, named by member: its entries are reached only under
// table_lock, which these functions take.
using ChargeTable = HandleTable<Charge> Hook::*;

void record(ChargeTable table, std::uint64_t handle, const Charge& charge_record) {
  TableLock locked;
  (hook().*table).put(handle, charge_record);
}

CUresult allocate_linear(CUdeviceptr* dptr, std::uint64_t bytes, unsigned managed_flags,
                         bool managed) {
  Hook& state = hook();
  const int device = current_device();
  if (device < 0 || dptr == nullptr || bytes == 0) {
    return managed ? state.real.cuMemAllocManaged(dptr, bytes, managed_flags)
                   : state.real.cuMemAlloc_v2(dptr, bytes);
  }
  const std::uint64_t charged = round_up(bytes, kAllocationUnit);
  const CUresult result = charged_call(device, charged, [&] {
    return managed ? state.real.cuMemAllocManaged(dptr, bytes, managed_flags)
                   : state.real.cuMemAlloc_v2(dptr, bytes);
  });
  if (result == CUDA_SUCCESS) {
    record(&Hook::allocations, *dptr, Charge{device, charged, current_context(), nullptr});
  }
  return result;
}

// --- pools -------------------------------------------------------------------------------
// A pool holds device memory it has reserved, not just what is allocated from it, so the
// group is charged each pool's reserved bytes. Pool operations are serialised so that a
// change in reserved bytes is attributed to the operation that caused it.

// False if the driver cannot say: the caller must not take that for zero.
bool pool_attribute(CUmemoryPool pool, int attribute, std::uint64_t& value) {
  std::uint64_t answer = 0;
  if (hook().real.cuMemPoolGetAttribute(pool, attribute, &answer) != CUDA_SUCCESS) return false;
  value = answer;
  return true;
}

// Brings a pool's charge in line with what it has reserved now. Growth we did not
// pre-charge is charged if it fits; false if it did not. A pool whose reservation cannot be
// read keeps its charge: a driver failure must never give memory back that the pool holds.
bool refresh_pool(CUmemoryPool pool, PoolCharge& record) REQUIRES(pool_lock) {
  std::uint64_t reserved = 0;
  if (!pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, reserved)) return true;
  if (reserved < record.charged) {
    uncharge(record.device, record.charged - reserved);
  } else if (reserved > record.charged) {
    if (!charge(record.device, reserved - record.charged)) return false;
  }
  record.charged = reserved;
  return true;
}

void refresh_all_pools() EXCLUDES(pool_lock, table_lock) {
  Hook& state = hook();
  if (!state.accounting) return;
  MutexLock pools_locked(pool_lock);
  {
    TableLock locked;
    if (state.pools.size() == 0) return;
  }
  // In batches, each copied out under the table lock and refreshed outside it (the driver is
  // not called with the table locked). Pools are added and removed only under pool_lock,
  // held throughout, so the table's order is the same from one batch to the next.
  constexpr int kBatch = 64;
  struct Entry {
    CUmemoryPool pool;
    PoolCharge record;
  } entries[kBatch];
  for (int first = 0;; first += kBatch) {
    int seen = 0, count = 0;
    {
      TableLock locked;
      state.pools.for_each([&](std::uint64_t key, PoolCharge& record) {
        if (record.destroy_pending) return;
        if (seen++ >= first && count < kBatch) {
          entries[count++] = Entry{reinterpret_cast<CUmemoryPool>(key), record};
        }
      });
    }
    for (int i = 0; i < count; ++i) {
      refresh_pool(entries[i].pool, entries[i].record);
      TableLock locked;
      if (PoolCharge* record = state.pools.find(reinterpret_cast<std::uint64_t>(entries[i].pool))) {
        record->charged = entries[i].record.charged;
      }
    }
    if (count < kBatch) break;
  }
}

template <typename Allocate>
CUresult allocate_from_pool(CUdeviceptr* dptr, std::uint64_t bytes, CUmemoryPool pool,
                            Allocate allocate) {
  Hook& state = hook();
  int device = current_device();
  if (pool == nullptr && device >= 0) state.real.cuDeviceGetMemPool(&pool, device);
  if (pool == nullptr || dptr == nullptr || bytes == 0) return allocate();
  const auto key = reinterpret_cast<std::uint64_t>(pool);

  MutexLock pools_locked(pool_lock);
  PoolCharge record{};
  {
    TableLock locked;
    if (PoolCharge* known = state.pools.find(key)) {
      record = *known;
    } else {
      record.device = device;  // a pool serves the device it was made for: the current one
    }
  }
  (void)refresh_pool(pool, record);  // catch up with releases at sync points
  const std::uint64_t reserved = record.charged;
  // Unknown use: none of the reservation is taken to be idle, so the request is charged whole.
  std::uint64_t in_use = reserved;
  (void)pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, in_use);
  const std::uint64_t idle = reserved > in_use ? reserved - in_use : 0;
  const std::uint64_t growth = idle >= bytes ? 0 : round_up(bytes - idle, kPoolGrowthUnit);
  bool allowed = charge(record.device, growth);
  if (!allowed) {
    // Idle pool memory counts against the group; give it back and try once more.
    state.real.cuMemPoolTrimTo(pool, 0);
    refresh_pool(pool, record);
    allowed = charge(record.device, growth);
  }
  CUresult result = CUDA_ERROR_OUT_OF_MEMORY;
  if (allowed) {
    // The estimate stands for the growth until the pool reports its real reservation, so
    // no other member can take that room in between.
    record.charged += growth;
    result = allocate();
    if (!refresh_pool(pool, record) && result == CUDA_SUCCESS) {
      // The pool grew past the limit: undo the allocation and its growth.
      state.real.cuMemFreeAsync(*dptr, nullptr);
      state.real.cuMemPoolTrimTo(pool, 0);
      refresh_pool(pool, record);
      result = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  if (result == CUDA_SUCCESS) ++record.live_allocations;
  {
    TableLock locked;
    state.pools.put(key, record);
    if (result == CUDA_SUCCESS)
      state.allocations.put(*dptr, Charge{record.device, 0, nullptr, pool});
  }
  return result;
}

// After a pool allocation is freed: the pool may have given memory back.
void settle_pool_after_free(CUmemoryPool pool) {
  Hook& state = hook();
  const auto key = reinterpret_cast<std::uint64_t>(pool);
  MutexLock pools_locked(pool_lock);
  PoolCharge record{};
  bool known = false;
  {
    TableLock locked;
    if (PoolCharge* found = state.pools.find(key)) {
      record = *found;
      known = true;
    }
  }
  if (known) {
    --record.live_allocations;
    if (record.destroy_pending && record.live_allocations == 0) {
      uncharge(record.device, record.charged);  // the driver has now released the pool
      TableLock locked;
      state.pools.take(key, record);
    } else {
      if (!record.destroy_pending) refresh_pool(pool, record);
      TableLock locked;
      state.pools.put(key, record);
    }
  }
}

// Takes handle's record out of table, then lets the driver release the handle; if the
// driver refuses, the record goes back. `released` is set to the record if it was tracked
// and is now gone. Taking the record first means an address the driver reuses at once
// cannot be confused with the one being freed.
template <typename Release>
CUresult untrack(ChargeTable table, std::uint64_t handle, Release release, Charge& released,
                 bool& was_tracked) {
  {
    TableLock locked;
    was_tracked = (hook().*table).take(handle, released);
  }
  const CUresult result = release();
  if (was_tracked && result != CUDA_SUCCESS) {
    record(table, handle, released);  // still allocated
    was_tracked = false;
  }
  return result;
}

template <typename Free>
CUresult free_tracked(CUdeviceptr dptr, Free free_call) {
  Charge released{};
  bool tracked = false;
  const CUresult result = untrack(&Hook::allocations, dptr, free_call, released, tracked);
  if (!tracked) return result;
  if (released.pool != nullptr) {
    settle_pool_after_free(released.pool);
  } else {
    uncharge(released.device, released.bytes);
  }
  return result;
}

// --- arrays ------------------------------------------------------------------------------

// A lower bound on an array's size: the driver adds padding that only it knows.
std::uint64_t array_estimate(const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned levels) {
  std::uint64_t total = 0;
  std::uint64_t width = desc.Width, height = desc.Height, depth = desc.Depth;
  for (unsigned level = 0; level < levels; ++level) {
    total += width * (height ? height : 1) * (depth ? depth : 1) *
             static_cast<std::uint64_t>(array_format_bytes(desc.Format)) * desc.NumChannels;
    width = width > 1 ? width / 2 : 1;
    height = height > 1 ? height / 2 : height;
    depth = depth > 1 ? depth / 2 : depth;
  }
  return total;
}

template <typename Create, typename Requirements, typename Destroy>
CUresult create_array(std::uint64_t* handle, std::uint64_t estimate, Create create,
                      Requirements requirements, Destroy destroy) {
  Hook& state = hook();
  const int device = current_device();
  if (device < 0 || handle == nullptr || !state.accounting) return create();
  const CUresult result = charged_call(device, estimate, create);
  if (result != CUDA_SUCCESS) return result;
  CUDA_ARRAY_MEMORY_REQUIREMENTS actual{};
  const std::uint64_t size =
      requirements(&actual, device) == CUDA_SUCCESS && actual.size > 0 ? actual.size : estimate;
  if (!settle_charge(device, estimate, size)) {
    destroy();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  record(&Hook::arrays, *handle, Charge{device, size, current_context(), nullptr});
  return CUDA_SUCCESS;
}

template <typename Destroy>
CUresult destroy_array(std::uint64_t handle, Destroy destroy) {
  Charge released{};
  bool tracked = false;
  const CUresult result = untrack(&Hook::arrays, handle, destroy, released, tracked);
  if (tracked) uncharge(released.device, released.bytes);
  return result;
}

// --- VMM ---------------------------------------------------------------------------------

// Frees a handle's charge once it is both released and unmapped, as the driver frees it.
void settle_vmm(CUmemGenericAllocationHandle handle, VmmCharge& record) REQUIRES(table_lock) {
  if (!record.released || record.maps > 0) return;
  VmmCharge removed{};
  hook().vmm_handles.take(handle, removed);
  uncharge(record.device, record.charged);
}

// --- contexts ----------------------------------------------------------------------------
// A context takes device memory the driver does not itemise. Before creating one, the group
// is charged what a context last cost on that device (learned in the ledger) or
// TESSERA_CONTEXT_MEMORY; after, the charge is settled on the measured change in this
// process's own usage in NVML's process list, which other processes cannot disturb. Where
// the process is not in that list (a PID namespace hides it), the estimate stands.
bool nvml_device_for(CUdevice device, nvmlDevice_t& nvml_device) {
  Hook& state = hook();
  if (!state.nvml_loaded || state.nvml.nvmlDeviceGetHandleByUUID == nullptr) return false;
  CUuuid uuid{};
  if (state.real.cuDeviceGetUuid(&uuid, device) != CUDA_SUCCESS) return false;
  char text[64];
  format_gpu_uuid(uuid, text);
  if (state.nvml.nvmlInit_v2 != nullptr) state.nvml.nvmlInit_v2();
  return state.nvml.nvmlDeviceGetHandleByUUID(text, &nvml_device) == NVML_SUCCESS;
}

// This process's device memory as NVML lists it; false if it is not listed.
bool own_usage(nvmlDevice_t nvml_device, std::uint64_t& used) {
  Hook& state = hook();
  if (state.nvml.nvmlDeviceGetComputeRunningProcesses_v3 == nullptr) return false;
  nvmlProcessInfo_t infos[256];
  unsigned count = 256;
  if (state.nvml.nvmlDeviceGetComputeRunningProcesses_v3(nvml_device, &count, infos) !=
      NVML_SUCCESS) {
    return false;
  }
  const auto self = static_cast<unsigned>(getpid());
  for (unsigned i = 0; i < count && i < 256; ++i) {
    if (infos[i].pid == self) {
      used = infos[i].usedGpuMemory;
      return true;
    }
  }
  return false;
}

std::uint64_t configured_context_memory() {
  std::uint64_t bytes = 0;
  const char* value = std::getenv("TESSERA_CONTEXT_MEMORY");
  if (value != nullptr && !parse_size(value, bytes)) {
    log(LogLevel::warn, "hook", "TESSERA_CONTEXT_MEMORY='%s' is not a size; charging nothing",
        value);
    bytes = 0;
  }
  return bytes;
}

// Creates a context through `create`, charging the memory it took. If that does not fit,
// destroys it through `destroy` and reports CUDA_ERROR_OUT_OF_MEMORY.
template <typename Create, typename Destroy>
CUresult create_context(CUdevice device, std::uint64_t& charged, Create create, Destroy destroy) {
  charged = 0;
  Hook& state = hook();
  if (!state.accounting || device < 0 || device >= kMaxDevices) return create();
  const std::uint64_t learned = state.ledger.context_estimate(device);
  const std::uint64_t configured = configured_context_memory();
  const std::uint64_t estimate = learned > configured ? learned : configured;
  nvmlDevice_t nvml_device = nullptr;
  const bool measurable = nvml_device_for(device, nvml_device);
  std::uint64_t before = 0;
  if (measurable && !own_usage(nvml_device, before)) before = 0;  // not listed: nothing yet
  const CUresult result = charged_call(device, estimate, create);
  if (result != CUDA_SUCCESS) return result;
  std::uint64_t after = 0;
  charged = estimate;
  if (measurable && own_usage(nvml_device, after)) {
    const std::uint64_t measured = after > before ? after - before : 0;
    state.ledger.learn_context_size(device, measured);
    if (!settle_charge(device, estimate, measured)) {
      destroy();
      charged = 0;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    charged = measured;
  }
  return result;
}

template <typename Create>
CUresult create_tracked_context(CUcontext* pctx, CUdevice device, Create create) {
  Hook& state = hook();
  std::uint64_t charged = 0;
  const CUresult result =
      create_context(device, charged, create, [&] { state.real.cuCtxDestroy_v2(*pctx); });
  if (result == CUDA_SUCCESS && pctx != nullptr) {
    record(&Hook::contexts, reinterpret_cast<std::uint64_t>(*pctx),
           Charge{device, charged, *pctx, nullptr});
  }
  return result;
}

// When the primary context's last reference goes, it and its memory are gone.
void end_primary(CUdevice device) {
  Hook& state = hook();
  CUcontext context = nullptr;
  std::uint64_t charged = 0;
  {
    TableLock locked;
    context = state.primary[device].context;
    charged = state.primary[device].charged;
    state.primary[device] = {nullptr, 0, 0};
  }
  uncharge(device, charged);
  if (context != nullptr) release_context_resources(context);
}

}  // namespace

void release_context_resources(CUcontext context) {
  Hook& state = hook();
  for (HandleTable<Charge>* table : {&state.allocations, &state.arrays}) {
    std::uint64_t handles[64];
    int count = 0;
    do {
      count = 0;
      TableLock locked;
      table->for_each([&](std::uint64_t handle, Charge& charge_record) {
        if (charge_record.context == context && charge_record.pool == nullptr && count < 64) {
          handles[count++] = handle;
        }
      });
      for (int i = 0; i < count; ++i) {
        Charge removed{};
        table->take(handles[i], removed);
        uncharge(removed.device, removed.bytes);
      }
    } while (count == 64);
  }
}

}  // namespace tessera::hook

// --- linear --------------------------------------------------------------------------------

HOOK_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t bytes) {
  HOOK_ENTER();
  if (!state.accounting) return state.real.cuMemAlloc_v2(dptr, bytes);
  return allocate_linear(dptr, bytes, 0, false);
}

HOOK_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, std::size_t bytes, unsigned int flags) {
  HOOK_ENTER();
  if (!state.accounting) return state.real.cuMemAllocManaged(dptr, bytes, flags);
  return allocate_linear(dptr, bytes, flags, true);
}

HOOK_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, std::size_t* pitch, std::size_t width,
                                        std::size_t height, unsigned int element_bytes) {
  HOOK_ENTER();
  const int device = state.accounting ? current_device() : -1;
  if (device < 0 || dptr == nullptr || pitch == nullptr) {
    return state.real.cuMemAllocPitch_v2(dptr, pitch, width, height, element_bytes);
  }
  // The driver picks the pitch; charge the unpadded size, then settle on pitch * height.
  const std::uint64_t estimate = static_cast<std::uint64_t>(width) * height;
  const CUresult result = charged_call(device, estimate, [&] {
    return state.real.cuMemAllocPitch_v2(dptr, pitch, width, height, element_bytes);
  });
  if (result != CUDA_SUCCESS) return result;
  const std::uint64_t actual =
      round_up(static_cast<std::uint64_t>(*pitch) * height, kAllocationUnit);
  if (!settle_charge(device, estimate, actual)) {
    state.real.cuMemFree_v2(*dptr);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  record(&Hook::allocations, *dptr, Charge{device, actual, current_context(), nullptr});
  return CUDA_SUCCESS;
}

HOOK_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  HOOK_ENTER();
  if (!state.accounting) return state.real.cuMemFree_v2(dptr);
  return free_tracked(dptr, [&] { return state.real.cuMemFree_v2(dptr); });
}

// --- stream-ordered ------------------------------------------------------------------------

HOOK_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, std::size_t bytes, CUstream stream) {
  HOOK_ENTER();
  auto call = [&] { return state.real.cuMemAllocAsync(dptr, bytes, stream); };
  if (!state.accounting) return call();
  return allocate_from_pool(dptr, bytes, nullptr, call);
}

HOOK_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes, CUstream stream) {
  HOOK_ENTER();
  auto call = [&] { return state.real.cuMemAllocAsync_ptsz(dptr, bytes, stream); };
  if (!state.accounting) return call();
  return allocate_from_pool(dptr, bytes, nullptr, call);
}

HOOK_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, std::size_t bytes,
                                             CUmemoryPool pool, CUstream stream) {
  HOOK_ENTER();
  auto call = [&] { return state.real.cuMemAllocFromPoolAsync(dptr, bytes, pool, stream); };
  if (!state.accounting || pool == nullptr) return call();
  return allocate_from_pool(dptr, bytes, pool, call);
}

HOOK_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes,
                                                  CUmemoryPool pool, CUstream stream) {
  HOOK_ENTER();
  auto call = [&] { return state.real.cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, stream); };
  if (!state.accounting || pool == nullptr) return call();
  return allocate_from_pool(dptr, bytes, pool, call);
}

HOOK_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  HOOK_ENTER();
  if (!state.accounting) return state.real.cuMemFreeAsync(dptr, stream);
  return free_tracked(dptr, [&] { return state.real.cuMemFreeAsync(dptr, stream); });
}

HOOK_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  HOOK_ENTER();
  if (!state.accounting) return state.real.cuMemFreeAsync_ptsz(dptr, stream);
  return free_tracked(dptr, [&] { return state.real.cuMemFreeAsync_ptsz(dptr, stream); });
}

HOOK_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, std::size_t keep) {
  HOOK_ENTER();
  const CUresult result = state.real.cuMemPoolTrimTo(pool, keep);
  if (result == CUDA_SUCCESS) refresh_all_pools();
  return result;
}

HOOK_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attribute, void* value) {
  HOOK_ENTER();
  const CUresult result = state.real.cuMemPoolSetAttribute(pool, attribute, value);
  if (result == CUDA_SUCCESS && attribute == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) refresh_all_pools();
  return result;
}

HOOK_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  HOOK_ENTER();
  const CUresult result = state.real.cuMemPoolDestroy(pool);
  if (result != CUDA_SUCCESS || !state.accounting) return result;
  tessera::MutexLock pools_locked(pool_lock);
  {
    TableLock locked;
    const auto key = reinterpret_cast<std::uint64_t>(pool);
    if (PoolCharge* record = state.pools.find(key)) {
      if (record->live_allocations == 0) {
        PoolCharge removed{};
        state.pools.take(key, removed);
        uncharge(removed.device, removed.charged);
      } else {
        record->destroy_pending = true;  // the driver keeps it until its memory is freed
      }
    }
  }
  return result;
}

// Pools give memory back above their release threshold at synchronisation points.
HOOK_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  HOOK_ENTER();
  const CUresult result = state.real.cuStreamSynchronize(stream);
  refresh_all_pools();
  return result;
}

HOOK_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  HOOK_ENTER();
  const CUresult result = state.real.cuStreamSynchronize_ptsz(stream);
  refresh_all_pools();
  return result;
}

HOOK_EXPORT CUresult cuEventSynchronize(CUevent event) {
  HOOK_ENTER();
  const CUresult result = state.real.cuEventSynchronize(event);
  refresh_all_pools();
  return result;
}

HOOK_EXPORT CUresult cuCtxSynchronize() {
  HOOK_ENTER();
  const CUresult result = state.real.cuCtxSynchronize();
  refresh_all_pools();
  return result;
}

// --- VMM -----------------------------------------------------------------------------------

HOOK_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size,
                                 const CUmemAllocationProp* prop, unsigned long long flags) {
  HOOK_ENTER();
  // Host locations (pinned host memory, as NCCL uses) are not device memory.
  if (!state.accounting || handle == nullptr || prop == nullptr ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return state.real.cuMemCreate(handle, size, prop, flags);
  }
  const int device = prop->location.id;
  const CUresult result =
      charged_call(device, size, [&] { return state.real.cuMemCreate(handle, size, prop, flags); });
  if (result == CUDA_SUCCESS) {
    TableLock locked;
    state.vmm_handles.put(*handle, VmmCharge{device, size, false, false, 0});
  }
  return result;
}

HOOK_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                    void* os_handle, int type) {
  HOOK_ENTER();
  const CUresult result = state.real.cuMemImportFromShareableHandle(handle, os_handle, type);
  if (result != CUDA_SUCCESS || !state.accounting || handle == nullptr) return result;
  CUmemAllocationProp prop{};
  if (state.real.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) == CUDA_SUCCESS &&
      prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    // Its size is known only when mapped; it is charged then.
    TableLock locked;
    state.vmm_handles.put(*handle, VmmCharge{prop.location.id, 0, true, false, 0});
  }
  return result;
}

HOOK_EXPORT CUresult cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags) {
  HOOK_ENTER();
  if (!state.accounting) return state.real.cuMemMap(ptr, size, offset, handle, flags);
  VmmCharge record{};
  bool tracked = false;
  {
    TableLock locked;
    if (VmmCharge* found = state.vmm_handles.find(handle)) {
      record = *found;
      tracked = true;
    }
  }
  // An imported handle is charged for what its first mapping shows of it.
  const std::uint64_t import_charge = tracked && record.imported && record.charged == 0 ? size : 0;
  if (!charge(record.device, import_charge)) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult result = state.real.cuMemMap(ptr, size, offset, handle, flags);
  if (result != CUDA_SUCCESS) {
    uncharge(record.device, import_charge);
    return result;
  }
  if (tracked) {
    TableLock locked;
    if (VmmCharge* found = state.vmm_handles.find(handle)) {
      found->charged += import_charge;
      ++found->maps;
    }
    state.vmm_mappings.put(ptr, VmmMapping{handle, size});
  }
  return result;
}

HOOK_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
  HOOK_ENTER();
  const CUresult result = state.real.cuMemUnmap(ptr, size);
  if (result != CUDA_SUCCESS || !state.accounting) return result;
  // One unmap may cover several whole mappings.
  TableLock locked;
  CUdeviceptr starts[64];
  int count = 0;
  do {
    count = 0;
    state.vmm_mappings.for_each([&](std::uint64_t start, VmmMapping&) {
      if (start >= ptr && start < ptr + size && count < 64) starts[count++] = start;
    });
    for (int i = 0; i < count; ++i) {
      VmmMapping mapping{};
      state.vmm_mappings.take(starts[i], mapping);
      if (VmmCharge* record = state.vmm_handles.find(mapping.handle)) {
        --record->maps;
        settle_vmm(mapping.handle, *record);
      }
    }
  } while (count == 64);
  return result;
}

HOOK_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  HOOK_ENTER();
  const CUresult result = state.real.cuMemRelease(handle);
  if (result != CUDA_SUCCESS || !state.accounting) return result;
  TableLock locked;
  if (VmmCharge* record = state.vmm_handles.find(handle)) {
    record->released = true;  // mappings keep the memory alive until unmapped
    settle_vmm(handle, *record);
  }
  return result;
}

// --- arrays --------------------------------------------------------------------------------

HOOK_EXPORT CUresult cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  HOOK_ENTER();
  auto create = [&] { return state.real.cuArrayCreate_v2(handle, desc); };
  if (desc == nullptr) return create();
  const CUDA_ARRAY3D_DESCRIPTOR as3d{desc->Width,  desc->Height,      0,
                                     desc->Format, desc->NumChannels, 0};
  return create_array(
      reinterpret_cast<std::uint64_t*>(handle), array_estimate(as3d, 1), create,
      [&](CUDA_ARRAY_MEMORY_REQUIREMENTS* out, int device) {
        return state.real.cuArrayGetMemoryRequirements
                   ? state.real.cuArrayGetMemoryRequirements(out, *handle, device)
                   : CUDA_ERROR_NOT_SUPPORTED;
      },
      [&] { return state.real.cuArrayDestroy(*handle); });
}

HOOK_EXPORT CUresult cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  HOOK_ENTER();
  auto create = [&] { return state.real.cuArray3DCreate_v2(handle, desc); };
  if (desc == nullptr) return create();
  return create_array(
      reinterpret_cast<std::uint64_t*>(handle), array_estimate(*desc, 1), create,
      [&](CUDA_ARRAY_MEMORY_REQUIREMENTS* out, int device) {
        return state.real.cuArrayGetMemoryRequirements
                   ? state.real.cuArrayGetMemoryRequirements(out, *handle, device)
                   : CUDA_ERROR_NOT_SUPPORTED;
      },
      [&] { return state.real.cuArrayDestroy(*handle); });
}

HOOK_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* handle,
                                            const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned levels) {
  HOOK_ENTER();
  auto create = [&] { return state.real.cuMipmappedArrayCreate(handle, desc, levels); };
  if (desc == nullptr) return create();
  return create_array(
      reinterpret_cast<std::uint64_t*>(handle), array_estimate(*desc, levels), create,
      [&](CUDA_ARRAY_MEMORY_REQUIREMENTS* out, int device) {
        return state.real.cuMipmappedArrayGetMemoryRequirements
                   ? state.real.cuMipmappedArrayGetMemoryRequirements(out, *handle, device)
                   : CUDA_ERROR_NOT_SUPPORTED;
      },
      [&] { return state.real.cuMipmappedArrayDestroy(*handle); });
}

HOOK_EXPORT CUresult cuArrayDestroy(CUarray handle) {
  HOOK_ENTER();
  return destroy_array(reinterpret_cast<std::uint64_t>(handle),
                       [&] { return state.real.cuArrayDestroy(handle); });
}

HOOK_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  HOOK_ENTER();
  return destroy_array(reinterpret_cast<std::uint64_t>(handle),
                       [&] { return state.real.cuMipmappedArrayDestroy(handle); });
}

// --- contexts ------------------------------------------------------------------------------

HOOK_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice device) {
  HOOK_ENTER();
  return create_tracked_context(pctx, device,
                                [&] { return state.real.cuCtxCreate_v2(pctx, flags, device); });
}

HOOK_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam_st* params, int count,
                                    unsigned int flags, CUdevice device) {
  HOOK_ENTER();
  return create_tracked_context(
      pctx, device, [&] { return state.real.cuCtxCreate_v3(pctx, params, count, flags, device); });
}

HOOK_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams_st* params,
                                    unsigned int flags, CUdevice device) {
  HOOK_ENTER();
  return create_tracked_context(
      pctx, device, [&] { return state.real.cuCtxCreate_v4(pctx, params, flags, device); });
}

HOOK_EXPORT CUresult cuCtxDestroy_v2(CUcontext context) {
  HOOK_ENTER();
  const CUresult result = state.real.cuCtxDestroy_v2(context);
  if (result != CUDA_SUCCESS || !state.accounting) return result;
  Charge charge_record{};
  bool tracked = false;
  {
    TableLock locked;
    tracked = state.contexts.take(reinterpret_cast<std::uint64_t>(context), charge_record);
  }
  if (tracked) uncharge(charge_record.device, charge_record.bytes);
  release_context_resources(context);
  return result;
}

HOOK_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice device) {
  HOOK_ENTER();
  if (!state.accounting || device < 0 || device >= tessera::kMaxDevices) {
    return state.real.cuDevicePrimaryCtxRetain(pctx, device);
  }
  bool first = false;
  {
    TableLock locked;
    first = state.primary[device].retains == 0;
  }
  if (!first) {
    const CUresult result = state.real.cuDevicePrimaryCtxRetain(pctx, device);
    if (result == CUDA_SUCCESS) {
      TableLock locked;
      ++state.primary[device].retains;
    }
    return result;
  }
  std::uint64_t charged = 0;
  const CUresult result = create_context(
      device, charged, [&] { return state.real.cuDevicePrimaryCtxRetain(pctx, device); },
      [&] { state.real.cuDevicePrimaryCtxRelease_v2(device); });
  if (result == CUDA_SUCCESS) {
    TableLock locked;
    auto& primary = state.primary[device];
    primary.context = *pctx;
    primary.charged += charged;
    ++primary.retains;
  }
  return result;
}

HOOK_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  HOOK_ENTER();
  const CUresult result = state.real.cuDevicePrimaryCtxRelease_v2(device);
  if (result != CUDA_SUCCESS || !state.accounting || device < 0 || device >= tessera::kMaxDevices) {
    return result;
  }
  bool last = false;
  {
    TableLock locked;
    last = state.primary[device].retains > 0 && --state.primary[device].retains == 0;
  }
  if (last) end_primary(device);
  return result;
}

HOOK_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  HOOK_ENTER();
  const CUresult result = state.real.cuDevicePrimaryCtxReset_v2(device);
  if (result == CUDA_SUCCESS && state.accounting && device >= 0 && device < tessera::kMaxDevices) {
    end_primary(device);
  }
  return result;
}
