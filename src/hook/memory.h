// Internal to the hook's device-memory quota (memory*.cpp, contexts.cpp): what its files share.
// Every entry point that takes device memory charges the group ledger before the driver is
// asked, and every one that gives memory back returns exactly what was charged. Where the
// driver decides the real size (pitch, arrays, pool growth), an estimate is charged first and
// reconciled with what the driver reports afterwards; if the real size does not fit, the
// allocation is undone and the caller gets CUDA_ERROR_OUT_OF_MEMORY.
#pragma once

#include "hook/hook.h"

namespace tessera::hook {

// Linear allocations take device memory in units of this size.
inline constexpr std::uint64_t kAllocationUnit = 512;
// Upper bound on how much a pool grows to serve one request beyond the request itself.
inline constexpr std::uint64_t kPoolGrowthUnit = 2ull << 20;

inline std::uint64_t round_up(std::uint64_t value, std::uint64_t unit) {
  return (value + unit - 1) / unit * unit;
}

inline CUcontext current_context() {
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
inline bool settle_charge(int device, std::uint64_t estimate, std::uint64_t actual) {
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

inline void record(ChargeTable table, std::uint64_t handle, const Charge& charge_record) {
  TableLock locked;
  (hook().*table).put(handle, charge_record);
}

// After a pool allocation is freed: the pool may have given memory back (memory_pools.cpp).
void settle_pool_after_free(CUmemoryPool pool);
// Brings every pool's charge in line with what it has reserved now (memory_pools.cpp).
void refresh_all_pools() EXCLUDES(pool_lock, table_lock);

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

}  // namespace tessera::hook
