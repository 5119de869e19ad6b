// Device-memory quota (memory.h): contexts, charged what a context costs on its device.
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
  if (!state.accounting || device < 0 || device >= kMostDevices) return create();
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
  if (!state.accounting || device < 0 || device >= tessera::kMostDevices) {
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
  if (result != CUDA_SUCCESS || !state.accounting || device < 0 ||
      device >= tessera::kMostDevices) {
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
  if (result == CUDA_SUCCESS && state.accounting && device >= 0 && device < tessera::kMostDevices) {
    end_primary(device);
  }
  return result;
}
