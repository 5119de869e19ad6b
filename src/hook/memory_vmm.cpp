// Device-memory quota (memory.h): virtual memory management, charged per physical handle.
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
namespace {

// --- VMM ---------------------------------------------------------------------------------

// Frees a handle's charge once it is both released and unmapped, as the driver frees it.
void settle_vmm(CUmemGenericAllocationHandle handle, VmmCharge& record) REQUIRES(table_lock) {
  if (!record.released || record.maps > 0) return;
  VmmCharge removed{};
  hook().vmm_handles.take(handle, removed);
  uncharge(record.device, record.charged);
}

}  // namespace
}  // namespace tessera::hook

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
