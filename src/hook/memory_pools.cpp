// Device-memory quota (memory.h): stream-ordered pools, charged what each has reserved.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "common/units.h"
#include "hook/memory.h"

using namespace tessera::abi;
using namespace tessera::hook;

namespace tessera::hook {

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

}  // namespace tessera::hook

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
