// Initialisation, fork handling, and the ways a process finds driver entry points:
// dlsym (exported here) and cuGetProcAddress. Direct calls reach the wrappers through
// LD_PRELOAD; Python's ctypes goes through dlsym.
#include "hook/hook.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/bounded_format.h"
#include "common/clock.h"
#include "common/immortal.h"
#include "common/log.h"
#include "contract/variables.h"

using namespace tessera::abi;

#define TESSERA_DECLARE_WRAPPER(name, params) extern "C" CUresult name params;
TESSERA_CUDA_HOOKED(TESSERA_DECLARE_WRAPPER)
#undef TESSERA_DECLARE_WRAPPER
#define TESSERA_DECLARE_WRAPPER(name, params) extern "C" nvmlReturn_t name params;
TESSERA_NVML_HOOKED(TESSERA_DECLARE_WRAPPER)
#undef TESSERA_DECLARE_WRAPPER

namespace tessera::hook {

constinit Mutex table_lock;
constinit Mutex pool_lock;
constinit Mutex coordination_lock;

namespace {

Immortal<Hook> storage;
pthread_once_t once = PTHREAD_ONCE_INIT;
std::atomic<bool> failure_reported{false};

using DlsymFunction = void* (*)(void*, const char*);

// glibc's dlsym, found by version so that our own export is never found instead.
DlsymFunction real_dlsym() {
  static std::atomic<DlsymFunction> cached{nullptr};
  DlsymFunction function = cached.load(std::memory_order_acquire);
  if (function == nullptr) {
    void* found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (found == nullptr) found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    function = reinterpret_cast<DlsymFunction>(found);
    cached.store(function, std::memory_order_release);
  }
  return function;
}

struct WrapperEntry {
  const char* name;
  void* wrapper;
  std::size_t real_offset;  // where the real pointer lives in Hook
};

#define TESSERA_CUDA_ENTRY(name, params) \
  {#name, reinterpret_cast<void*>(&::name), offsetof(Hook, real) + offsetof(RealDriver, name)},
#define TESSERA_NVML_ENTRY(name, params) \
  {#name, reinterpret_cast<void*>(&::name), offsetof(Hook, nvml) + offsetof(RealNvml, name)},
const WrapperEntry kWrappers[] = {TESSERA_CUDA_HOOKED(TESSERA_CUDA_ENTRY)
                                      TESSERA_NVML_HOOKED(TESSERA_NVML_ENTRY)};
#undef TESSERA_CUDA_ENTRY
#undef TESSERA_NVML_ENTRY

void* real_pointer(const WrapperEntry& entry) {
  void* slot;
  std::memcpy(&slot, reinterpret_cast<const char*>(&storage.get()) + entry.real_offset,
              sizeof slot);
  return slot;
}

// The exported variant the driver picks for a base name, CUDA version and stream flags.
struct VariantRule {
  const char* base;
  int version;
  const char* legacy;
  const char* per_thread;  // nullptr where there is no per-thread-stream form
};
constexpr VariantRule kVariantRules[] = {
    {"cuInit", 2000, "cuInit", nullptr},
    {"cuGetProcAddress", 11030, "cuGetProcAddress", nullptr},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2", nullptr},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2", nullptr},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", nullptr},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2", nullptr},
    {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", nullptr},
    {"cuMemAllocManaged", 6000, "cuMemAllocManaged", nullptr},
    {"cuMemFree", 3020, "cuMemFree_v2", nullptr},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
    {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
    {"cuMemFreeAsync", 11020, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
    {"cuMemPoolTrimTo", 11020, "cuMemPoolTrimTo", nullptr},
    {"cuMemPoolSetAttribute", 11020, "cuMemPoolSetAttribute", nullptr},
    {"cuMemPoolDestroy", 11020, "cuMemPoolDestroy", nullptr},
    {"cuStreamSynchronize", 2000, "cuStreamSynchronize", "cuStreamSynchronize_ptsz"},
    {"cuEventSynchronize", 2000, "cuEventSynchronize", nullptr},
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize", nullptr},
    // CUDA 13 added cuCtxSynchronize_v2(ctx), which is not interposed: answering with the
    // old wrapper would hand out the wrong signature, so the driver's pointer stands.
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2", nullptr},
    {"cuMemCreate", 10020, "cuMemCreate", nullptr},
    {"cuMemRelease", 10020, "cuMemRelease", nullptr},
    {"cuMemMap", 10020, "cuMemMap", nullptr},
    {"cuMemUnmap", 10020, "cuMemUnmap", nullptr},
    {"cuMemImportFromShareableHandle", 10020, "cuMemImportFromShareableHandle", nullptr},
    {"cuArrayCreate", 3020, "cuArrayCreate_v2", nullptr},
    {"cuArray3DCreate", 3020, "cuArray3DCreate_v2", nullptr},
    {"cuArrayDestroy", 2000, "cuArrayDestroy", nullptr},
    {"cuMipmappedArrayCreate", 5000, "cuMipmappedArrayCreate", nullptr},
    {"cuMipmappedArrayDestroy", 5000, "cuMipmappedArrayDestroy", nullptr},
    {"cuCtxCreate", 3020, "cuCtxCreate_v2", nullptr},
    {"cuCtxCreate", 11040, "cuCtxCreate_v3", nullptr},
    {"cuCtxCreate", 12050, "cuCtxCreate_v4", nullptr},
    {"cuCtxDestroy", 4000, "cuCtxDestroy_v2", nullptr},
    {"cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain", nullptr},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2", nullptr},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2", nullptr},
    {"cuLaunchKernel", 4000, "cuLaunchKernel", "cuLaunchKernel_ptsz"},
    {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},
    {"cuLaunchCooperativeKernel", 9000, "cuLaunchCooperativeKernel",
     "cuLaunchCooperativeKernel_ptsz"},
    {"cuGraphLaunch", 10000, "cuGraphLaunch", "cuGraphLaunch_ptsz"},
    {"cuLaunchHostFunc", 10000, "cuLaunchHostFunc", "cuLaunchHostFunc_ptsz"},
};

const char* variant_name(const char* base, int version, cuuint64_t flags) {
  const VariantRule* best = nullptr;
  for (const VariantRule& rule : kVariantRules) {
    if (std::strcmp(rule.base, base) == 0 && rule.version <= version &&
        (best == nullptr || rule.version > best->version)) {
      best = &rule;
    }
  }
  if (best == nullptr) return nullptr;
  if (flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM && best->per_thread != nullptr) {
    return best->per_thread;
  }
  return best->legacy;
}

void after_fork_in_child() {
  Hook& state = storage.get();
  table_lock.reset_after_fork();
  pool_lock.reset_after_fork();
  coordination_lock.reset_after_fork();
  // The child owns no device memory: CUDA state does not survive fork.
  TableLock locked;
  state.allocations.clear();
  state.arrays.clear();
  state.contexts.clear();
  state.pools.clear();
  state.vmm_handles.clear();
  state.vmm_mappings.clear();
  std::memset(state.primary, 0, sizeof state.primary);
  state.ledger.after_fork_in_child();  // the child joins on its first charge
}

// A container's ledger is written by the node agent before the container starts (at the
// kubelet's PreStartContainer): one missing is waited for, up to TESSERA_LEDGER_WAIT_MS
// (default 10 s), then refused, so a container never runs without its own limits.
bool wait_for_ledger(const char* path, ErrorText& error) {
  long wait_ms = 10'000;
  if (const char* text = std::getenv(contract::kLedgerWaitVariable); text != nullptr && *text) {
    char* end = nullptr;
    wait_ms = std::strtol(text, &end, 10);
    if (*end != '\0' || wait_ms < 0 || wait_ms > 600'000) {
      return error.set("%s='%.32s' must be milliseconds from 0 to 600000",
                       contract::kLedgerWaitVariable, text);
    }
  }
  const std::uint64_t give_up = monotonic_ns() + static_cast<std::uint64_t>(wait_ms) * 1'000'000;
  while (access(path, F_OK) != 0) {
    if (monotonic_ns() >= give_up) {
      return error.set(
          "%s: no ledger after %ld ms: the node agent has not given this container its limits "
          "(its PreStartContainer did not run or failed; see the node agent's log)",
          path, wait_ms);
    }
    sleep_until_ns(monotonic_ns() + 10'000'000);
  }
  return true;
}

// Coordination files are found beside a file ledger, and the group is known there by the
// ledger's identity.
bool coordinate_beside(Hook& state, const char* ledger_path) {
  if (!format_bounded(state.ledger_path, sizeof state.ledger_path, state.failure, "%s",
                      ledger_path)) {
    return false;
  }
  state.group_identity = ledger::group_identity(ledger_path);
  return true;
}

bool open_ledger(Hook& state, const DeviceLimits& limits) {
  ledger::GroupSpec spec;
  spec.limits = limits;
  spec.priority = state.priority;
  if (const char* path = std::getenv(contract::kLedgerVariable);
      path != nullptr && path[0] != '\0') {
    if (!wait_for_ledger(path, state.failure) || !state.ledger.open(path, state.failure) ||
        !coordinate_beside(state, path)) {
      return false;
    }
  } else if (const char* cache = std::getenv(contract::kHamiSharedCacheVariable);
             cache != nullptr && cache[0] != '\0') {
    spec.name = "hami";
    if (!state.ledger.create_or_open(cache, spec, state.failure) ||
        !coordinate_beside(state, cache)) {
      return false;
    }
  } else if (limits.any() || limits.any_cores()) {
    spec.name = "process";
    if (!state.ledger.create_private(spec, state.failure)) return false;
  } else {
    return true;  // nothing to enforce: forward every call untouched
  }
  state.ledger.set_process_limits(limits);
  state.burst = state.burst || state.ledger.group_bursts();  // its creator's word, or its own
  state.priority = state.ledger.effective_priority(state.priority);
  if (!state.ledger.join(state.failure)) return false;
  state.accounting = true;
  return true;
}

void initialize() {
  Hook& state = storage.construct();

  const char* driver_path = std::getenv("TESSERA_REAL_LIBCUDA");
  if (driver_path == nullptr || driver_path[0] == '\0') driver_path = "libcuda.so.1";
  void* driver = dlopen(driver_path, RTLD_NOW | RTLD_GLOBAL);
  if (driver == nullptr) {
    state.failure.set("cannot load the CUDA driver %s: %s", driver_path, dlerror());
    state.failed = true;
    return;
  }
  DlsymFunction lookup = real_dlsym();
#define TESSERA_RESOLVE(name, params) \
  state.real.name = reinterpret_cast<PFN_##name>(lookup(driver, #name));
  TESSERA_CUDA_HOOKED(TESSERA_RESOLVE)
  TESSERA_CUDA_PASSTHROUGH(TESSERA_RESOLVE)
  if (void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL); nvml != nullptr) {
#define TESSERA_RESOLVE_NVML(name, params) \
  state.nvml.name = reinterpret_cast<PFN_##name>(lookup(nvml, #name));
    TESSERA_NVML_HOOKED(TESSERA_RESOLVE_NVML)
    TESSERA_NVML_PASSTHROUGH(TESSERA_RESOLVE_NVML)
#undef TESSERA_RESOLVE_NVML
    state.nvml_loaded = true;
  }
#undef TESSERA_RESOLVE

  const char* burst = std::getenv(contract::kBurstVariable);
  if (burst != nullptr && burst[0] != '\0' && std::strcmp(burst, "0") != 0 &&
      std::strcmp(burst, "1") != 0) {
    state.failure.set("%s='%.32s' must be 0 or 1", contract::kBurstVariable, burst);
    state.failed = true;
    return;
  }
  state.burst = burst != nullptr && std::strcmp(burst, "1") == 0;
  DeviceLimits limits;
  if (!priority_from_environment(state.priority, state.failure) ||
      !priority_tolerance_from_environment(state.priority_tolerance, state.failure) ||
      !memory_limits_from_environment(limits, state.failure) ||
      !core_limits_from_environment(limits, state.failure) || !open_ledger(state, limits)) {
    state.failed = true;
    return;
  }
  if (state.priority != Priority::none && state.ledger_path[0] == '\0') {
    // Priorities are kept between groups through the coordination files beside their ledgers.
    log(LogLevel::warn, "hook", "a priority has no effect without a group ledger (%s or %s)",
        contract::kLedgerVariable, contract::kHamiSharedCacheVariable);
    state.priority = Priority::none;
  }
  if (state.accounting) {
    state.compute_limited = state.priority != Priority::none;
    for (int device = 0; device < kMostDevices; ++device) {
      state.compute_limited = state.compute_limited || state.ledger.effective_cores(device) != 0;
    }
  }
  pthread_atfork(nullptr, nullptr, after_fork_in_child);
  log(LogLevel::info, "hook", "ready: %s",
      state.accounting ? "enforcing group limits" : "no limits");
}

bool is_driver_library(const char* path) {
  if (path == nullptr) return false;
  const char* base = std::strrchr(path, '/');
  base = base ? base + 1 : path;
  if (std::strncmp(base, "libcuda.so", 10) == 0 || std::strncmp(base, "libnvidia-ml.so", 15) == 0) {
    return true;
  }
  const char* configured = std::getenv("TESSERA_REAL_LIBCUDA");
  return configured != nullptr && std::strcmp(path, configured) == 0;
}

// RTLD_NEXT means "after the caller", and the caller glibc would see is now this library,
// so find the next object after the real caller that defines the symbol.
void* next_definition(const char* name, const void* caller) {
  Dl_info info;
  link_map* caller_map = nullptr;
  if (dladdr1(caller, &info, reinterpret_cast<void**>(&caller_map), RTLD_DL_LINKMAP) == 0 ||
      caller_map == nullptr) {
    return nullptr;
  }
  for (link_map* map = caller_map->l_next; map != nullptr; map = map->l_next) {
    void* found = real_dlsym()(map, name);
    link_map* owner = nullptr;
    if (found != nullptr &&
        dladdr1(found, &info, reinterpret_cast<void**>(&owner), RTLD_DL_LINKMAP) != 0 &&
        owner == map) {
      return found;
    }
  }
  return nullptr;
}

}  // namespace

Hook& hook() {
  pthread_once(&once, initialize);
  return storage.get();
}

CUresult failure_result() {
  if (!failure_reported.exchange(true)) {
    log(LogLevel::error, "hook", "CUDA is disabled in this process: %s", hook().failure.text);
  }
  return CUDA_ERROR_NOT_INITIALIZED;
}

int current_device() {
  CUdevice device = -1;
  if (hook().real.cuCtxGetDevice(&device) != CUDA_SUCCESS) return -1;
  return device;
}

namespace {

// Opens device's coordination file, writing its header anew in place first if something wrote
// over it (every group using it then finds it whole). Under coordination_lock. Problems are said
// once until the file is usable again.
bool open_coordination(Hook& state, int device, DeviceCoordination& entry)
    REQUIRES(coordination_lock) {
  CUuuid uuid{};
  ErrorText error;
  const auto get_uuid = state.real.cuDeviceGetUuid_v2 != nullptr ? state.real.cuDeviceGetUuid_v2
                                                                 : state.real.cuDeviceGetUuid;
  bool opened = false;
  if (get_uuid == nullptr || get_uuid(&uuid, device) != CUDA_SUCCESS) {
    error.set("device %d: its UUID cannot be read for its coordination file", device);
  } else {
    unsigned char bytes[16];
    std::memcpy(bytes, uuid.bytes, sizeof bytes);
    const contract::DeviceKey key = contract::device_key(bytes);
    if (contract::coordination_path(state.ledger_path, key, entry.path, sizeof entry.path, error)) {
      if (char* slash = std::strrchr(entry.path, '/'); slash != nullptr) {  // outside a cluster,
        *slash = '\0';  // the first group on a device makes the directory
        mkdir(entry.path, 0777);
        *slash = '/';
      }
      opened = entry.demand.open(entry.path, key, state.group_identity, error);
      bool repaired = false;
      if (!opened && ledger::prepare_coordination_file(entry.path, key, repaired, error)) {
        if (repaired && !entry.said)  // not when it merely did not exist yet
          log(LogLevel::error, "hook", "%s; its header was written anew", error.text);
        opened = entry.demand.open(entry.path, key, state.group_identity, error);
      }
    }
  }
  if (!opened && !entry.said) {
    log(LogLevel::error, "hook",
        "%s: this group is not coordinated with others on device %d until it can be used%s",
        error.text, device,
        state.priority == Priority::low ? "; its low-priority launches wait meanwhile" : "");
  }
  entry.said = !opened;
  return opened;
}

constexpr std::uint64_t kCoordinationRetryNs = 100'000'000;

}  // namespace

ledger::Demand* coordination(int device) {
  Hook& state = hook();
  if (device < 0 || device >= kMostDevices || state.ledger_path[0] == '\0') return nullptr;
  DeviceCoordination& entry = state.coordination[device];
  const int known = entry.state.load(std::memory_order_acquire);
  if (known == kOpen && entry.demand.intact()) return &entry.demand;
  const std::uint64_t now = monotonic_ns();
  if (now < entry.retry_at_ns.load(std::memory_order_relaxed)) return nullptr;
  MutexLock locked(coordination_lock);
  ledger::Demand* usable = nullptr;
  if (entry.state.load(std::memory_order_relaxed) != kOpen) {
    if (open_coordination(state, device, entry)) {
      usable = &entry.demand;
      entry.state.store(kOpen, std::memory_order_release);
    }
  } else if (entry.demand.intact()) {
    usable = &entry.demand;  // another thread repaired it
  } else {
    // Written over while in use: made whole in place (the mapping is never given up, since
    // other threads may be using it).
    ErrorText error;
    if (entry.demand.repair(error)) usable = &entry.demand;
    if (!entry.said) {
      log(LogLevel::error, "hook", "%s: something wrote over it; %s", entry.path,
          usable != nullptr ? "its header was written anew" : error.text);
    }
    entry.said = usable == nullptr;
  }
  entry.retry_at_ns.store(usable != nullptr ? 0 : now + kCoordinationRetryNs,
                          std::memory_order_relaxed);
  return usable;
}

void format_gpu_uuid(const CUuuid& uuid, char (&text)[64]) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  std::snprintf(text, sizeof text,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
}

bool charge(int device, std::uint64_t bytes) {
  Hook& state = hook();
  if (!state.accounting || device < 0 || device >= kMostDevices || bytes == 0) return true;
  if (!state.ledger.joined()) {  // a forked child joins on its first charge
    ErrorText error;
    if (!state.ledger.join(error)) {
      log(LogLevel::error, "hook", "%s", error.text);
      return false;
    }
  }
  if (state.ledger.reserve(device, bytes)) return true;
  if (const char* damage = state.ledger.damage(); damage != nullptr) {
    static std::atomic<bool> said{false};  // once: every allocation from now on is refused
    if (!said.exchange(true)) {
      log(LogLevel::error, "hook", "%s; refusing every allocation from now on", damage);
    }
    return false;
  }
  log(LogLevel::info, "hook", "refused %llu bytes on device %d: group limit %llu reached",
      static_cast<unsigned long long>(bytes), device,
      static_cast<unsigned long long>(state.ledger.effective_limit(device)));
  return false;
}

void uncharge(int device, std::uint64_t bytes) {
  Hook& state = hook();
  if (!state.accounting || device < 0 || device >= kMostDevices || bytes == 0) return;
  state.ledger.release(device, bytes);
}

void* wrapper_by_name(const char* name) {
  for (const WrapperEntry& entry : kWrappers) {
    if (std::strcmp(entry.name, name) == 0) return entry.wrapper;
  }
  return nullptr;
}

void* wrapper_for(const char* symbol, void* real_function, int cuda_version, cuuint64_t flags) {
  if (real_function == nullptr) return nullptr;
  for (const WrapperEntry& entry : kWrappers) {
    if (real_pointer(entry) == real_function) return entry.wrapper;
  }
  // Drivers may hand out internal addresses; fall back to the variant they would pick.
  if (const char* name = variant_name(symbol, cuda_version, flags); name != nullptr) {
    if (void* wrapper = wrapper_by_name(name); wrapper != nullptr) return wrapper;
  }
  return real_function;
}

}  // namespace tessera::hook

using namespace tessera::hook;

HOOK_EXPORT void* dlsym(void* handle, const char* name) {
  void* found = handle == RTLD_NEXT ? next_definition(name, __builtin_return_address(0))
                                    : real_dlsym()(handle, name);
  if (found == nullptr || (name[0] != 'c' && name[0] != 'n')) return found;
  void* wrapper = wrapper_by_name(name);
  if (wrapper == nullptr || wrapper == found) return found;
  Dl_info info;
  if (dladdr(found, &info) != 0 && is_driver_library(info.dli_fname)) return wrapper;
  return found;
}

HOOK_EXPORT CUresult cuInit(unsigned int flags) {
  HOOK_ENTER();
  return state.real.cuInit(flags);
}

HOOK_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  HOOK_ENTER();
  if (state.real.cuGetProcAddress_v2 == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult result = state.real.cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, status);
  if (result == CUDA_SUCCESS && pfn != nullptr && symbol != nullptr) {
    *pfn = wrapper_for(symbol, *pfn, cuda_version, flags);
  }
  return result;
}

HOOK_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                      cuuint64_t flags) {
  HOOK_ENTER();
  if (state.real.cuGetProcAddress == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult result = state.real.cuGetProcAddress(symbol, pfn, cuda_version, flags);
  if (result == CUDA_SUCCESS && pfn != nullptr && symbol != nullptr) {
    *pfn = wrapper_for(symbol, *pfn, cuda_version, flags);
  }
  return result;
}
