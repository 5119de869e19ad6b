// What a process in a group sees: the group's limit as the device's size, and the group's
// usage (dead members excluded) as what is used. Free is what the group may still take,
// never negative and never more than the device physically has free.
#include <cstdio>
#include <type_traits>

#include "hook/hook.h"

using namespace tessera::abi;
using namespace tessera::hook;

namespace tessera::hook {
namespace {

struct View {
  std::uint64_t total, free, used;
};

// Narrows a physical view of `device` to the group's; false if no limit applies.
bool group_view(int device, std::uint64_t physical_total, std::uint64_t physical_free, View& view) {
  Hook& state = hook();
  if (!state.accounting || device < 0 || device >= kMostDevices) return false;
  const ledger::DeviceUsage usage = state.ledger.usage(device);
  if (usage.limit == kUnlimited) return false;
  view.total = usage.limit < physical_total ? usage.limit : physical_total;
  view.used = usage.used;
  const std::uint64_t headroom = usage.used < view.total ? view.total - usage.used : 0;
  view.free = headroom < physical_free ? headroom : physical_free;
  return true;
}

// NVML numbers devices physically; the ledger by CUDA ordinal. Match them by UUID.
int ordinal_of(nvmlDevice_t nvml_device) {
  Hook& state = hook();
  char wanted[96] = {};
  if (state.nvml.nvmlDeviceGetUUID(nvml_device, wanted, sizeof wanted) != NVML_SUCCESS) return -1;
  if (state.real.cuInit(0) != CUDA_SUCCESS) return -1;
  int count = 0;
  state.real.cuDeviceGetCount(&count);
  for (int ordinal = 0; ordinal < count && ordinal < kMostDevices; ++ordinal) {
    CUuuid uuid{};
    if (state.real.cuDeviceGetUuid(&uuid, ordinal) != CUDA_SUCCESS) continue;
    char text[64];
    format_gpu_uuid(uuid, text);
    if (__builtin_strcmp(text, wanted) == 0) return ordinal;
  }
  return -1;
}

}  // namespace
}  // namespace tessera::hook

HOOK_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  HOOK_ENTER();
  const CUresult result = state.real.cuMemGetInfo_v2(free, total);
  if (result != CUDA_SUCCESS || !state.accounting) return result;
  View view{};
  if (group_view(current_device(), *total, *free, view)) {
    *total = view.total;
    *free = view.free;
  }
  return result;
}

HOOK_EXPORT CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice device) {
  HOOK_ENTER();
  const CUresult result = state.real.cuDeviceTotalMem_v2(bytes, device);
  if (result != CUDA_SUCCESS || !state.accounting || device < 0 ||
      device >= tessera::kMostDevices) {
    return result;
  }
  const std::uint64_t limit = state.ledger.effective_limit(device);
  if (limit != tessera::kUnlimited && limit < *bytes) *bytes = limit;
  return result;
}

namespace tessera::hook {
namespace {

// Both NVML memory structs carry total, free and used; v2 also a driver reservation, which
// lies outside the group's slice.
template <typename Memory, typename Query>
nvmlReturn_t nvml_view(nvmlDevice_t device, Memory* memory, Query query) {
  Hook& state = hook();
  if (query == nullptr) return NVML_ERROR_DRIVER_NOT_LOADED;
  const nvmlReturn_t result = query(device, memory);
  if (result != NVML_SUCCESS || state.failed || !state.accounting) return result;
  View view{};
  if (group_view(ordinal_of(device), memory->total, memory->free, view)) {
    memory->total = view.total;
    memory->free = view.free;
    memory->used = view.used;
    if constexpr (std::is_same_v<Memory, nvmlMemory_v2_t>) memory->reserved = 0;
  }
  return result;
}

}  // namespace
}  // namespace tessera::hook

HOOK_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  return nvml_view(device, memory, hook().nvml.nvmlDeviceGetMemoryInfo);
}

HOOK_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  return nvml_view(device, memory, hook().nvml.nvmlDeviceGetMemoryInfo_v2);
}

// nvidia-smi inside a slice lists the group's own processes only.
HOOK_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int* count,
                                                                 nvmlProcessInfo_t* infos) {
  Hook& state = hook();
  const auto query = state.nvml.nvmlDeviceGetComputeRunningProcesses_v3;
  if (query == nullptr) return NVML_ERROR_DRIVER_NOT_LOADED;
  if (state.failed || !state.accounting || count == nullptr) return query(device, count, infos);
  nvmlProcessInfo_t all[512];
  unsigned found = 512;
  const nvmlReturn_t result = query(device, &found, all);
  if (result != NVML_SUCCESS) return result;
  std::int32_t members[tessera::kMostMembers];
  const int member_count = state.ledger.live_pids(members, tessera::kMostMembers);
  unsigned kept = 0;
  for (unsigned i = 0; i < found; ++i) {
    bool in_group = false;
    for (int m = 0; m < member_count && m < tessera::kMostMembers; ++m) {
      in_group = in_group || static_cast<unsigned>(members[m]) == all[i].pid;
    }
    if (in_group) all[kept++] = all[i];
  }
  const unsigned capacity = *count;
  *count = kept;
  if (kept > capacity || (kept > 0 && infos == nullptr)) return NVML_ERROR_INSUFFICIENT_SIZE;
  for (unsigned i = 0; i < kept; ++i) infos[i] = all[i];
  return NVML_SUCCESS;
}
