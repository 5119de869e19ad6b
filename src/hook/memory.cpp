// Device-memory quota (memory.h): linear allocations and arrays.
#include "hook/memory.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "common/units.h"

using namespace tessera::abi;
using namespace tessera::hook;

namespace tessera::hook {
namespace {

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

}  // namespace
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
