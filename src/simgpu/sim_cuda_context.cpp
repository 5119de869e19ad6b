// The simulated driver's contexts: created, current per thread, primary per device.
#include "simgpu/sim_cuda_internal.h"

namespace tessera::sim {

namespace {

CUresult new_context(CUdevice ordinal, Context*& context) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (CUresult taken = take_device_memory(index, spec_of(index).context_bytes);
      taken != CUDA_SUCCESS) {
    return taken;
  }
  context = static_cast<Context*>(std::calloc(1, sizeof(Context)));
  if (context == nullptr) {
    machine().uncharge(index, spec_of(index).context_bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  context->device = index;
  context->ordinal = ordinal;
  context->default_stream.context = context;
  Lock locked;
  locked->contexts.put(reinterpret_cast<std::uint64_t>(context), 1);
  return CUDA_SUCCESS;
}

// Frees a context and the linear allocations and arrays made in it.
void destroy_context(Context* context) {
  struct Dead {
    CUdeviceptr address;
    Allocation allocation;
  } dead[64];
  for (;;) {
    int count = 0;
    {
      Lock locked;
      locked->allocations.for_each([&](std::uint64_t address, Allocation& allocation) {
        if (allocation.context == context && count < 64) dead[count++] = Dead{address, allocation};
      });
      for (int i = 0; i < count; ++i) {
        Allocation ignored;
        locked->allocations.take(dead[i].address, ignored);
      }
    }
    for (int i = 0; i < count; ++i) {
      const Allocation& allocation = dead[i].allocation;
      unmap_host(reinterpret_cast<void*>(dead[i].address), allocation.host_bytes,
                 allocation.host_mapped);
      machine().uncharge(allocation.device, allocation.charged);
    }
    if (count < 64) break;
  }
  std::uint64_t arrays[64];
  int array_count = 0;
  {
    Lock locked;
    locked->arrays.for_each([&](std::uint64_t handle, ArrayRecord& record) {
      if (record.context == context && array_count < 64) arrays[array_count++] = handle;
    });
  }
  for (int i = 0; i < array_count; ++i) destroy_array(arrays[i]);
  {
    Lock locked;
    char ignored;
    locked->contexts.take(reinterpret_cast<std::uint64_t>(context), ignored);
  }
  machine().uncharge(context->device, spec_of(context->device).context_bytes);
  // A destroyed current context is popped, as cuCtxPopCurrent would.
  if (current_context == context)
    current_context = context_depth > 0 ? context_stack[--context_depth] : nullptr;
  std::free(context);
}

CUresult create_context(CUcontext* pctx, CUdevice ordinal) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* context = nullptr;
  if (CUresult status = new_context(ordinal, context); status != CUDA_SUCCESS) return status;
  if (context_depth < 16) context_stack[context_depth++] = current_context;
  current_context = context;
  *pctx = reinterpret_cast<CUcontext>(context);
  return CUDA_SUCCESS;
}

bool is_live_context(CUcontext context) {
  Lock locked;
  return locked->contexts.find(reinterpret_cast<std::uint64_t>(context)) != nullptr;
}

}  // namespace

}  // namespace tessera::sim

using namespace tessera::sim;

// --- contexts ------------------------------------------------------------------------------

SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice ordinal) {
  (void)flags;
  return create_context(pctx, ordinal);
}

SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam_st* params, int count,
                                   unsigned int flags, CUdevice ordinal) {
  if (count < 0 || (count > 0 && params == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  (void)flags;
  return create_context(pctx, ordinal);
}

SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams_st* params,
                                   unsigned int flags, CUdevice ordinal) {
  (void)params;
  (void)flags;
  return create_context(pctx, ordinal);
}

SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  auto* context = reinterpret_cast<Context*>(ctx);
  if (ctx == nullptr || !is_live_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  {
    Lock locked;
    if (locked->primary[context->ordinal].context == context) return CUDA_ERROR_INVALID_CONTEXT;
  }
  destroy_context(context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(current_context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (ctx != nullptr && !is_live_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  current_context = reinterpret_cast<Context*>(ctx);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (ctx == nullptr || !is_live_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (context_depth == 16) return CUDA_ERROR_INVALID_VALUE;
  context_stack[context_depth++] = current_context;
  current_context = reinterpret_cast<Context*>(ctx);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (current_context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(current_context);
  current_context = context_depth > 0 ? context_stack[--context_depth] : nullptr;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = context->ordinal;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSynchronize() {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  machine().wait(context->device, std::atomic_ref<std::uint64_t>(context->latest_ticket).load());
  release_pools_on_sync();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* context = nullptr;
  {
    Lock locked;
    context = locked->primary[ordinal].context;
    if (context != nullptr) ++locked->primary[ordinal].retains;
  }
  if (context == nullptr) {
    if (CUresult status = new_context(ordinal, context); status != CUDA_SUCCESS) return status;
    Lock locked;
    locked->primary[ordinal].context = context;
    locked->primary[ordinal].retains = 1;
  }
  *pctx = reinterpret_cast<CUcontext>(context);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  Context* dying = nullptr;
  {
    Lock locked;
    auto& primary = locked->primary[ordinal];
    if (primary.retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--primary.retains == 0) {
      dying = primary.context;
      primary.context = nullptr;
    }
  }
  if (dying != nullptr) destroy_context(dying);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  Context* dying = nullptr;
  {
    Lock locked;
    auto& primary = locked->primary[ordinal];
    dying = primary.context;
    primary.context = nullptr;
    primary.retains = 0;
  }
  if (dying != nullptr) destroy_context(dying);
  return CUDA_SUCCESS;
}
