// The simulated CUDA driver (libcuda.so.1): the driver API on host memory, for machines
// without an NVIDIA driver. Exported names and semantics follow the driver API docs on the
// paths Tessera depends on; see docs/simulated-gpu.md for what is and is not simulated.
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
#include "simgpu/sim_machine.h"

using namespace tessera::abi;
using tessera::Immortal;
using tessera::kMaxDevices;
using tessera::LogLevel;
using tessera::monotonic_ns;
using tessera::sleep_until_ns;

namespace tessera::sim {

constinit Mutex driver_lock;

namespace {

constexpr std::uint64_t kAllocationUnit = 512;
constexpr std::uint64_t kPoolChunk = 2ull << 20;
constexpr std::uint64_t kVmmGranularity = 2ull << 20;
constexpr std::uint64_t kArraySizeUnit = 64ull << 10;
constexpr std::uint64_t kSmallAllocation = 64ull << 10;
constexpr int kDriverVersion = 13000;

std::uint64_t round_up(std::uint64_t value, std::uint64_t unit) {
  return (value + unit - 1) / unit * unit;
}

Immortal<Driver> driver_storage;
pthread_once_t driver_once = PTHREAD_ONCE_INIT;

thread_local Context* current_context = nullptr;
thread_local Context* context_stack[16];
thread_local int context_depth = 0;

void reset_after_fork();

void construct_driver() {
  driver_storage.construct();
  pthread_atfork(nullptr, nullptr, reset_after_fork);
}

Driver& driver() {
  pthread_once(&driver_once, construct_driver);
  return driver_storage.get();
}

// CUDA cannot be used across fork: the child starts with nothing and must cuInit again.
void reset_after_fork() {
  Driver& state = driver_storage.get();
  driver_lock.reset_after_fork();
  MutexLock locked(driver_lock);
  state.initialized = false;
  std::memset(state.primary, 0, sizeof state.primary);
  std::memset(state.default_pool, 0, sizeof state.default_pool);
  std::memset(state.current_pool, 0, sizeof state.current_pool);
  state.allocations.clear();
  state.contexts.clear();
  state.pools.clear();
  state.vmm_handles.clear();
  state.mappings.clear();
  state.arrays.clear();
  current_context = nullptr;
  context_depth = 0;
  forget_mps(state.mps);
  machine().after_fork_in_child();
}

// Holds driver_lock for its scope, and reaches the driver's state through it.
class SCOPED_CAPABILITY Lock {
 public:
  Lock() ACQUIRE(driver_lock) : driver_(driver()) { driver_lock.lock(); }
  ~Lock() RELEASE() { driver_lock.unlock(); }
  Driver* operator->() { return &driver_; }

 private:
  Driver& driver_;
};

// A device CUDA can enumerate: a whole GPU, or a MIG device (a compute instance; its memory
// is its GPU instance's).
struct Candidate {
  int device;  // simulated device (sim_machine.h)
  DeviceSpec spec;
};

// What the driver enumerates with no CUDA_VISIBLE_DEVICES: each GPU, or, for a GPU in MIG
// mode (which runs no CUDA work as a whole), each of its MIG devices.
int enumerate_devices(Candidate* out, int capacity) {
  const MachineSpec& spec = machine().spec();
  int count = 0;
  for (int gpu = 0; gpu < spec.device_count && count < capacity; ++gpu) {
    const DeviceSpec& whole = spec.devices[gpu];
    const MigState& mig = machine().lock_mig(gpu);
    if (mig.current == 0) {
      out[count++] = {gpu, whole};
    } else {
      for (int slot = 0; slot < kMigSlots; ++slot) {
        const MigGpuInstance& instance = mig.instances[slot];
        for (int ci = 0; instance.used != 0 && ci < kMigSlots && count < capacity; ++ci) {
          if (instance.compute[ci].used == 0) continue;
          Candidate& device = out[count++];
          device = {mig_device_id(gpu, slot), whole};
          std::snprintf(device.spec.name, sizeof device.spec.name, "%s %s", whole.name,
                        instance.name);
          format_mig_uuid(gpu, instance, ci, device.spec.uuid, sizeof device.spec.uuid);
          device.spec.memory_bytes = instance.memory_mib << 20;
          device.spec.sm_count = static_cast<int>(instance.compute[ci].sms);
          device.spec.mig_family = -1;
        }
      }
    }
    machine().unlock_mig();
  }
  return count;
}

// The candidate an entry of CUDA_VISIBLE_DEVICES names, or -1: an ordinal of the default
// enumeration, a prefix of a GPU's UUID (a GPU in MIG mode is no CUDA device), a MIG device's
// UUID (or a prefix), or MIG-<GPU UUID>/<GPU instance ID>/<compute instance ID>.
int find_candidate(const char* item, const Candidate* candidates, int count) {
  const std::size_t length = std::strlen(item);
  if (length == 0) return -1;
  if (std::strncmp(item, "GPU-", 4) == 0 || std::strncmp(item, "MIG-", 4) == 0) {
    for (int i = 0; i < count; ++i) {
      if (std::strncmp(candidates[i].spec.uuid, item, length) == 0) return i;
    }
    if (std::strncmp(item, "MIG-GPU-", 8) != 0) return -1;
    const char* slash = std::strchr(item, '/');
    unsigned gi_id = 0, ci_id = 0;
    char tail = 0;
    if (slash == nullptr || std::sscanf(slash, "/%u/%u%c", &gi_id, &ci_id, &tail) != 2) return -1;
    const std::string_view gpu_uuid(item + 4, static_cast<std::size_t>(slash - item - 4));
    const MachineSpec& spec = machine().spec();
    for (int i = 0; i < count; ++i) {
      const int gpu = gpu_of(candidates[i].device);
      if (!is_mig_device(candidates[i].device) || gpu_uuid != spec.devices[gpu].uuid) continue;
      const MigState& mig = machine().lock_mig(gpu);
      const MigGpuInstance& instance = mig.instances[gi_slot_of(candidates[i].device)];
      char uuid[48];
      format_mig_uuid(gpu, instance, static_cast<int>(ci_id), uuid, sizeof uuid);
      const bool named = instance.used != 0 && instance.id == gi_id && ci_id < kMigSlots &&
                         instance.compute[ci_id].used != 0 &&
                         std::strcmp(uuid, candidates[i].spec.uuid) == 0;
      machine().unlock_mig();
      if (named) return i;
    }
    return -1;
  }
  char* number_end = nullptr;
  const long index = std::strtol(item, &number_end, 10);
  if (number_end == item || *number_end != '\0' || index < 0 || index >= count) return -1;
  return static_cast<int>(index);
}

// Visible devices: CUDA_VISIBLE_DEVICES lists ordinals or UUIDs (or prefixes); the list ends
// at the first entry that names no device, or one already listed, as with the real driver.
int parse_visible_devices(int* machine_index, DeviceSpec* visible) {
  Candidate candidates[kMaxDevices * kMigSlots];
  const int count = enumerate_devices(candidates, kMaxDevices * kMigSlots);
  const char* list = std::getenv("CUDA_VISIBLE_DEVICES");
  int shown = 0;
  if (list == nullptr) {
    for (; shown < count && shown < kMaxDevices; ++shown) {
      machine_index[shown] = candidates[shown].device;
      visible[shown] = candidates[shown].spec;
    }
    return shown;
  }
  for (const char* cursor = list; *cursor != '\0' && shown < kMaxDevices;) {
    const char* end = std::strchr(cursor, ',');
    const std::size_t length = end ? static_cast<std::size_t>(end - cursor) : std::strlen(cursor);
    char item[96] = {};
    if (length >= sizeof item) break;
    std::memcpy(item, cursor, length);
    const int found = find_candidate(item, candidates, count);
    if (found < 0) break;
    bool repeated = false;
    for (int i = 0; i < shown; ++i) repeated |= machine_index[i] == candidates[found].device;
    if (repeated) break;
    machine_index[shown] = candidates[found].device;
    visible[shown++] = candidates[found].spec;
    if (end == nullptr) break;
    cursor = end + 1;
  }
  return shown;
}

CUresult require_initialized() {
  return driver().initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult require_context(Context*& context) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  context = current_context;
  return context != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult machine_device(CUdevice ordinal, int& index) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (ordinal < 0 || ordinal >= driver().device_count) return CUDA_ERROR_INVALID_DEVICE;
  index = driver().machine_index[ordinal];
  return CUDA_SUCCESS;
}

// A simulated device's spec, as this process's driver enumerated it.
const DeviceSpec& spec_of(int device) {
  const Driver& state = driver();
  for (int ordinal = 0; ordinal < state.device_count; ++ordinal) {
    if (state.machine_index[ordinal] == device) return state.visible[ordinal];
  }
  return machine().spec().devices[gpu_of(device)];
}

// Takes device memory for this process: refused when an MPS client's daemon has gone, or
// past its pinned-memory limit on that device, or when the device is full.
// Guards no field: it makes an MPS client's check of its limit and its charge one step.
constinit Mutex mps_memory_lock;
CUresult take_device_memory(int device, std::uint64_t bytes) {
  const MpsClient& mps = driver().mps;
  if (mps.fd < 0) return machine().charge(device, bytes) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  if (mps_daemon_gone(mps)) return CUDA_ERROR_MPS_RPC_FAILURE;
  std::uint64_t limit = 0;
  for (int ordinal = 0; ordinal < driver().device_count; ++ordinal) {
    if (driver().machine_index[ordinal] == device) limit = mps.limits.pinned_bytes[ordinal];
  }
  MutexLock locked(mps_memory_lock);  // the check and the charge as one, across threads
  const bool within = limit == 0 || machine().process_used(device) + bytes <= limit;
  const bool taken = within && machine().charge(device, bytes);
  return taken ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

void* map_host(std::uint64_t bytes, bool& mapped) {
  mapped = bytes > kSmallAllocation;
  if (!mapped) return std::aligned_alloc(kAllocationUnit, round_up(bytes, kAllocationUnit));
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return memory == MAP_FAILED ? nullptr : memory;
}

void unmap_host(void* memory, std::uint64_t bytes, bool mapped) {
  if (mapped) {
    munmap(memory, bytes);
  } else {
    std::free(memory);
  }
}

// Backs and records an allocation whose device bytes are already taken.
CUresult record_allocation(CUdeviceptr* dptr, std::uint64_t bytes, const Allocation& record) {
  Allocation allocation = record;
  allocation.host_bytes = bytes;
  void* memory = map_host(bytes, allocation.host_mapped);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto address = reinterpret_cast<CUdeviceptr>(memory);
  Lock locked;
  if (!locked->allocations.put(address, allocation)) {
    unmap_host(memory, bytes, allocation.host_mapped);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = address;
  return CUDA_SUCCESS;
}

CUresult allocate_linear(CUdeviceptr* dptr, std::uint64_t bytes) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  const std::uint64_t charged = round_up(bytes, kAllocationUnit);
  if (CUresult taken = take_device_memory(context->device, charged); taken != CUDA_SUCCESS) {
    return taken;
  }
  const CUresult status = record_allocation(
      dptr, bytes, Allocation{context, nullptr, context->device, charged, 0, false});
  if (status != CUDA_SUCCESS) machine().uncharge(context->device, charged);
  return status;
}

// --- stream-ordered pools --------------------------------------------------------------

Pool* new_pool(int device, bool is_default) REQUIRES(driver_lock) {
  auto* pool = static_cast<Pool*>(std::calloc(1, sizeof(Pool)));
  if (pool == nullptr) return nullptr;
  pool->device = device;
  pool->is_default = is_default;
  driver().pools.put(reinterpret_cast<std::uint64_t>(pool), 1);
  return pool;
}

Pool* current_pool_locked(Driver& state, int ordinal) REQUIRES(driver_lock) {
  if (state.current_pool[ordinal] != nullptr) return state.current_pool[ordinal];
  if (state.default_pool[ordinal] == nullptr) {
    state.default_pool[ordinal] = new_pool(state.machine_index[ordinal], true);
  }
  return state.current_pool[ordinal] = state.default_pool[ordinal];
}

void shrink_pool_locked(Pool* pool, std::uint64_t keep) {
  std::uint64_t target = round_up(pool->used, kPoolChunk);
  if (keep > target) target = keep < pool->reserved ? keep : pool->reserved;
  if (pool->reserved > target) {
    machine().uncharge(pool->device, pool->reserved - target);
    pool->reserved = target;
  }
}

void finish_pool_destroy_locked(Driver& state, Pool* pool) REQUIRES(driver_lock) {
  machine().uncharge(pool->device, pool->reserved);
  char ignored;
  state.pools.take(reinterpret_cast<std::uint64_t>(pool), ignored);
  std::free(pool);
}

// At a synchronisation point pools give back what they hold above their release threshold.
void release_pools_on_sync() {
  Lock locked;
  locked->pools.for_each([](std::uint64_t key, char&) {
    auto* pool = reinterpret_cast<Pool*>(key);
    shrink_pool_locked(pool, pool->release_threshold);
  });
}

CUresult allocate_from_pool(CUdeviceptr* dptr, std::uint64_t bytes, Pool* pool) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t size = round_up(bytes, kAllocationUnit);
  {
    Lock locked;
    if (pool == nullptr || locked->pools.find(reinterpret_cast<std::uint64_t>(pool)) == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::uint64_t idle = pool->reserved - pool->used;
    if (idle < size) {
      const std::uint64_t grow = round_up(size - idle, kPoolChunk);
      if (CUresult taken = take_device_memory(pool->device, grow); taken != CUDA_SUCCESS) {
        return taken;
      }
      pool->reserved += grow;
      if (pool->reserved > pool->reserved_high) pool->reserved_high = pool->reserved;
    }
    pool->used += size;
    if (pool->used > pool->used_high) pool->used_high = pool->used;
  }
  const CUresult status =
      record_allocation(dptr, bytes, Allocation{nullptr, pool, pool->device, size, 0, false});
  if (status != CUDA_SUCCESS) {
    Lock locked;
    pool->used -= size;
  }
  return status;
}

CUresult allocate_async(CUdeviceptr* dptr, std::size_t bytes, CUstream stream) {
  (void)stream;  // the simulated device completes work in issue order, at once
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  Pool* pool = nullptr;
  {
    Lock locked;
    pool = current_pool_locked(*locked.operator->(), context->ordinal);
  }
  return allocate_from_pool(dptr, bytes, pool);
}

CUresult free_allocation(CUdeviceptr dptr) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  Allocation allocation{};
  {
    Lock locked;
    if (!locked->allocations.take(dptr, allocation)) return CUDA_ERROR_INVALID_VALUE;
    if (Pool* pool = allocation.pool; pool != nullptr) {
      pool->used -= allocation.charged;
      if (pool->destroy_pending && pool->used == 0)
        finish_pool_destroy_locked(*locked.operator->(), pool);
    }
  }
  unmap_host(reinterpret_cast<void*>(dptr), allocation.host_bytes, allocation.host_mapped);
  if (allocation.pool == nullptr) machine().uncharge(allocation.device, allocation.charged);
  return CUDA_SUCCESS;
}

// --- arrays ----------------------------------------------------------------------------

// Bytes an array takes on the device: rows padded to 512 bytes, the whole to 64 KiB.
bool array_bytes(const CUDA_ARRAY3D_DESCRIPTOR& desc, std::uint64_t& bytes) {
  const int element = array_format_bytes(desc.Format);
  const unsigned channels = desc.NumChannels;
  if (element == 0 || (channels != 1 && channels != 2 && channels != 4) || desc.Width == 0) {
    return false;
  }
  const std::uint64_t pitch = round_up(desc.Width * element * channels, kAllocationUnit);
  const std::uint64_t rows = (desc.Height ? desc.Height : 1) * (desc.Depth ? desc.Depth : 1);
  bytes = round_up(pitch * rows, kArraySizeUnit);
  return true;
}

CUresult create_array(std::uint64_t* handle, const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned levels) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (handle == nullptr || levels == 0) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t total = 0;
  CUDA_ARRAY3D_DESCRIPTOR level = desc;
  for (unsigned i = 0; i < levels; ++i) {
    std::uint64_t bytes = 0;
    if (!array_bytes(level, bytes)) return CUDA_ERROR_INVALID_VALUE;
    total += bytes;
    level.Width = level.Width > 1 ? level.Width / 2 : 1;
    level.Height = level.Height > 1 ? level.Height / 2 : level.Height;
    level.Depth = level.Depth > 1 ? level.Depth / 2 : level.Depth;
  }
  if (CUresult taken = take_device_memory(context->device, total); taken != CUDA_SUCCESS) {
    return taken;
  }
  auto* token = static_cast<char*>(std::malloc(1));  // a unique handle value
  Lock locked;
  if (token == nullptr || !locked->arrays.put(reinterpret_cast<std::uint64_t>(token),
                                              ArrayRecord{context, context->device, total})) {
    std::free(token);
    machine().uncharge(context->device, total);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *handle = reinterpret_cast<std::uint64_t>(token);
  return CUDA_SUCCESS;
}

CUresult destroy_array(std::uint64_t handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  ArrayRecord record{};
  {
    Lock locked;
    if (!locked->arrays.take(handle, record)) return CUDA_ERROR_INVALID_HANDLE;
  }
  machine().uncharge(record.device, record.bytes);
  std::free(reinterpret_cast<void*>(handle));
  return CUDA_SUCCESS;
}

CUresult array_requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* requirements, std::uint64_t handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (requirements == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Lock locked;
  const ArrayRecord* record = locked->arrays.find(handle);
  if (record == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::memset(requirements, 0, sizeof *requirements);
  requirements->size = record->bytes;
  requirements->alignment = kAllocationUnit;
  return CUDA_SUCCESS;
}

// --- contexts --------------------------------------------------------------------------

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

// --- VMM -------------------------------------------------------------------------------

CUresult check_allocation_prop(const CUmemAllocationProp* prop, int& device) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
    return CUDA_ERROR_INVALID_VALUE;
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      return machine_device(prop->location.id, device);
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      device = -1;
      return require_initialized();
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

VmmHandle* find_vmm_handle_locked(Driver& state, CUmemGenericAllocationHandle handle)
    REQUIRES(driver_lock) {
  VmmHandle** found = state.vmm_handles.find(handle);
  return found ? *found : nullptr;
}

// Frees a handle's memory once it is both released and unmapped.
void maybe_free_vmm_handle(VmmHandle* handle) {
  {
    Lock locked;
    if (!handle->released || handle->maps > 0) return;
    VmmHandle* ignored;
    locked->vmm_handles.take(reinterpret_cast<std::uint64_t>(handle), ignored);
  }
  close(handle->memfd);
  if (handle->charged) machine().uncharge(handle->device, handle->size);
  std::free(handle);
}

// The device a shared memfd was made for, from its name ("tessera-vmm-d<N>").
int device_of_memfd(int fd) {
  char link[64], target[256] = {};
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  if (readlink(link, target, sizeof target - 1) < 0) return -1;
  const char* marker = std::strstr(target, "tessera-vmm-d");
  return marker ? std::atoi(marker + std::strlen("tessera-vmm-d")) : -1;
}

Stream* stream_of(CUstream handle, Context* context) {
  // Null, CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2) name the default stream.
  if (reinterpret_cast<std::uintptr_t>(handle) <= 2) return &context->default_stream;
  return reinterpret_cast<Stream*>(handle);
}

// Stream captures in progress in this process, by number: a call the driver forbids during a
// capture invalidates it, and its end then fails, as CUDA's does.
constinit Mutex captures_lock;
struct ActiveCaptures {
  std::uint64_t next GUARDED_BY(captures_lock) = 0;
  Graph* graphs[64] GUARDED_BY(captures_lock) = {};
};
ActiveCaptures captures_in_progress;  // constant-initialised, trivially destroyed
ActiveCaptures& active_captures() {
  return captures_in_progress;
}

// Registers a capture; false when too many are in progress.
bool begin_capture(Graph* graph) {
  ActiveCaptures& captures = active_captures();
  MutexLock locked(captures_lock);
  bool placed = false;
  for (Graph*& slot : captures.graphs) {
    if (slot == nullptr) {
      graph->capture_sequence = ++captures.next;
      slot = graph;
      placed = true;
      break;
    }
  }
  return placed;
}

void end_capture(Graph* graph) {
  ActiveCaptures& captures = active_captures();
  MutexLock locked(captures_lock);
  for (Graph*& slot : captures.graphs) {
    if (slot == graph) slot = nullptr;
  }
}

// The capture numbered `sequence`, if still in progress, is invalidated.
void invalidate_capture(std::uint64_t sequence) {
  ActiveCaptures& captures = active_captures();
  MutexLock locked(captures_lock);
  for (Graph* graph : captures.graphs) {
    if (graph != nullptr && graph->capture_sequence == sequence) {
      __atomic_store_n(&graph->invalidated, true, __ATOMIC_RELAXED);
    }
  }
}

// Waiting for, querying or timing an event recorded into a capture is refused and breaks the
// capture (CUDA_ERROR_CAPTURED_EVENT); success otherwise.
CUresult refuse_captured_event(const Event* event) {
  if (event->captured_sequence == 0) return CUDA_SUCCESS;
  invalidate_capture(event->captured_sequence);
  return CUDA_ERROR_CAPTURED_EVENT;
}

bool append_to_graph(Graph* graph, std::uint64_t duration_ns) {
  if (graph->count == graph->capacity) {
    const int capacity = graph->capacity == 0 ? 16 : graph->capacity * 2;
    auto* grown = static_cast<std::uint64_t*>(
        std::realloc(graph->durations, static_cast<std::size_t>(capacity) * sizeof(std::uint64_t)));
    if (grown == nullptr) return false;
    graph->durations = grown;
    graph->capacity = capacity;
  }
  graph->durations[graph->count++] = duration_ns;
  return true;
}

// Puts work on the device's timeline behind the stream, or into the graph being captured.
// Queues work (or, of no duration, a marker such as an event) on the device after the
// stream's; returns its ticket.
std::uint64_t queue_on_device(Stream* stream, std::uint64_t duration_ns,
                              std::uint32_t sm_permille = 0) {
  Context* context = stream->context;
  stream->last_ticket = machine().submit(context->device, duration_ns, sm_permille);
  std::atomic_ref<std::uint64_t> latest(context->latest_ticket);
  std::uint64_t seen = latest.load();
  while (seen < stream->last_ticket && !latest.compare_exchange_weak(seen, stream->last_ticket)) {
  }
  return stream->last_ticket;
}

// `sm_permille`: of the device's SMs the work spreads over (0: all the process may use).
CUresult submit(Stream* stream, std::uint64_t duration_ns, std::uint32_t sm_permille = 0) {
  if (stream->capture != nullptr) {
    return append_to_graph(stream->capture, duration_ns) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  }
  queue_on_device(stream, duration_ns, sm_permille);
  return CUDA_SUCCESS;
}

// "name@20us" runs 20 microseconds per wave; a name without a duration runs 10 us.
std::uint64_t duration_from_name(const char* name) {
  const char* at = std::strrchr(name, '@');
  if (at == nullptr) return 10000;
  char* unit = nullptr;
  const double value = std::strtod(at + 1, &unit);
  if (unit == at + 1 || value <= 0) return 10000;
  double scale = 1000;  // us
  if (std::strcmp(unit, "ns") == 0) scale = 1;
  if (std::strcmp(unit, "ms") == 0) scale = 1e6;
  if (std::strcmp(unit, "s") == 0) scale = 1e9;
  return static_cast<std::uint64_t>(value * scale);
}

CUresult launch(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                unsigned block_y, unsigned block_z, CUstream handle) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (grid_x == 0 || grid_y == 0 || grid_z == 0 || block_x == 0 || block_y == 0 || block_z == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const MpsClient& mps = driver().mps;
  if (mps_daemon_gone(mps)) return CUDA_ERROR_MPS_RPC_FAILURE;
  // A wave is one block per SM: a grid larger than the device takes several. An MPS client
  // has only its active thread percentage of the SMs.
  const std::uint64_t blocks = std::uint64_t{grid_x} * grid_y * grid_z;
  auto sms = static_cast<std::uint64_t>(spec_of(context->device).sm_count);
  if (mps.fd >= 0) {
    const auto share =
        static_cast<std::uint64_t>(static_cast<double>(sms) * mps.limits.thread_percentage / 100.0);
    sms = share > 0 ? share : 1;
  }
  const std::uint64_t waves = (blocks + sms - 1) / sms;
  // A grid smaller than its SMs leaves the rest to other MPS clients' kernels.
  const std::uint64_t device_sms = static_cast<std::uint64_t>(spec_of(context->device).sm_count);
  const auto used_permille = static_cast<std::uint32_t>(
      std::max<std::uint64_t>(1, std::min(blocks, sms) * 1000 / device_sms));
  return submit(stream_of(handle, context), reinterpret_cast<Function*>(f)->duration_ns * waves,
                mps.fd >= 0 ? used_permille : 0);
}

// Blocks until the stream's work is done; refused while it is being captured.
CUresult synchronize_stream(CUstream handle) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  Stream* stream = stream_of(handle, context);
  if (stream->capture != nullptr) {
    __atomic_store_n(&stream->capture->invalidated, true, __ATOMIC_RELAXED);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  machine().wait(context->device, stream->last_ticket);
  release_pools_on_sync();
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace tessera::sim

using namespace tessera::sim;

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

// --- initialisation and devices ----------------------------------------------------------

SIM_EXPORT CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& state = driver();
  tessera::ErrorText error;
  if (!machine().attach(error)) {
    tessera::log(LogLevel::error, "simgpu", "%s", error.text);
    return CUDA_ERROR_NO_DEVICE;
  }
  Lock locked;
  if (!state.initialized) {
    state.device_count = parse_visible_devices(state.machine_index, state.visible);
    if (CUresult attached = attach_mps(state.mps); attached != CUDA_SUCCESS) return attached;
    if (state.mps.fd >= 0) {
      machine().join_mps_server(
          state.mps.limits.server,
          static_cast<std::uint32_t>(state.mps.limits.thread_percentage * 10 + 0.5));
    }
    state.initialized = true;
  }
  return state.device_count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

SIM_EXPORT CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetCount(int* count) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = driver().device_count;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetName(char* name, int length, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (name == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<std::size_t>(length), "%s", spec_of(index).name);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" -> 16 bytes
  const char* text = spec_of(index).uuid + 4;
  int byte = 0;
  for (const char* p = text; *p != '\0' && byte < 16; ++p) {
    if (*p == '-') continue;
    char pair[3] = {p[0], p[1] ? p[1] : '0', '\0'};
    uuid->bytes[byte++] = static_cast<char>(std::strtol(pair, nullptr, 16));
    if (p[1] == '\0') break;
    ++p;
  }
  while (byte < 16) uuid->bytes[byte++] = 0;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice ordinal) {
  return cuDeviceGetUuid_v2(uuid, ordinal);
}

SIM_EXPORT CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = spec_of(index).memory_bytes;
  return CUDA_SUCCESS;
}

// What an H100 SXM answers to cuDeviceGetAttribute (CUDA 12), by attribute number; the
// device's own spec overrides SMs, compute capability and PCI location. Attributes not
// listed (128, 130, 131 and those past 132) get CUDA_ERROR_INVALID_VALUE, as from a driver
// that predates them.
struct AttributeValue {
  int attribute, value;
};
constexpr AttributeValue kH100Attributes[] = {
    {1, 1024},        {2, 1024},    {3, 1024},       {4, 64},          {5, 2147483647},
    {6, 65535},       {7, 65535},   {8, 49152},      {9, 65536},       {10, 32},
    {11, 2147483647}, {12, 65536},  {13, 1980000},   {14, 512},        {15, 1},
    {17, 0},          {18, 0},      {19, 1},         {20, 0},          {21, 131072},
    {22, 131072},     {23, 65536},  {24, 16384},     {25, 16384},      {26, 16384},
    {27, 32768},      {28, 32768},  {29, 2048},      {30, 512},        {31, 1},
    {32, 1},          {34, 0},      {35, 0},         {36, 2619000},    {37, 5120},
    {38, 52428800},   {39, 2048},   {40, 3},         {41, 1},          {42, 32768},
    {43, 2048},       {44, 0},      {45, 32768},     {46, 32768},      {47, 8192},
    {48, 8192},       {49, 32768},  {51, 32},        {52, 32768},      {53, 32768},
    {54, 2046},       {55, 32768},  {56, 131072},    {57, 65536},      {58, 16384},
    {59, 16384},      {60, 16384},  {61, 32768},     {62, 2048},       {63, 32768},
    {64, 32768},      {65, 2048},   {66, 32768},     {67, 32768},      {68, 2046},
    {69, 268435456},  {70, 131072}, {71, 65000},     {72, 2097120},    {73, 32768},
    {74, 32768},      {77, 32768},  {78, 1},         {79, 1},          {80, 1},
    {81, 233472},     {82, 65536},  {83, 1},         {84, 0},          {85, 0},
    {86, 0},          {87, 2},      {88, 0},         {89, 1},          {90, 1},
    {91, 1},          {92, 1},      {93, 1},         {94, 1},          {95, 1},
    {96, 1},          {97, 232448}, {98, 0},         {99, 1},          {100, 0},
    {101, 0},         {102, 1},     {103, 1},        {104, 0},         {105, 0},
    {106, 32},        {107, 1},     {108, 33554432}, {109, 134213632}, {110, 1},
    {111, 1024},      {112, 1},     {113, 1},        {114, 1},         {115, 1},
    {116, 1},         {117, 1},     {118, 100},      {119, 1},         {120, 1},
    {121, 1},         {122, 1},     {123, 1},        {124, 1},         {125, 1},
    {126, 4},         {127, 1},     {129, 0},        {132, 0},
};

SIM_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const DeviceSpec& spec = spec_of(index);
  unsigned domain = 0, bus = 0, device = 0;
  std::sscanf(spec.pci_bus_id, "%x:%x:%x", &domain, &bus, &device);
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = spec.sm_count;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = spec.cc_major;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = spec.cc_minor;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *value = static_cast<int>(bus);
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      *value = static_cast<int>(domain);
      return CUDA_SUCCESS;
    default:
      for (const AttributeValue& known : kH100Attributes) {
        if (known.attribute == attribute) {
          *value = known.value;
          return CUDA_SUCCESS;
        }
      }
      return CUDA_ERROR_INVALID_VALUE;
  }
}

SIM_EXPORT CUresult cuDeviceGetPCIBusId(char* bus_id, int length, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (bus_id == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(bus_id, static_cast<std::size_t>(length), "%s", spec_of(index).pci_bus_id);
  return CUDA_SUCCESS;
}

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

// --- linear memory -----------------------------------------------------------------------

SIM_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t capacity = spec_of(context->device).memory_bytes;
  const std::uint64_t used = machine().used(context->device);
  *total = capacity;
  *free = used < capacity ? capacity - used : 0;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t bytes) {
  return allocate_linear(dptr, bytes);
}

SIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, std::size_t* pitch, std::size_t width,
                                       std::size_t height, unsigned int element_bytes) {
  if (pitch == nullptr || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (element_bytes != 4 && element_bytes != 8 && element_bytes != 16) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t row = round_up(width, kAllocationUnit);
  const CUresult status = allocate_linear(dptr, row * height);
  if (status == CUDA_SUCCESS) *pitch = row;
  return status;
}

SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, std::size_t bytes, unsigned int flags) {
  if (flags != 1 && flags != 2) return CUDA_ERROR_INVALID_VALUE;  // GLOBAL or HOST
  return allocate_linear(dptr, bytes);
}

SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  if (dptr == 0) return require_initialized();
  return free_allocation(dptr);
}

SIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size,
                                            CUdeviceptr dptr) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  bool found = false;
  Lock locked;
  locked->allocations.for_each([&](std::uint64_t address, Allocation& allocation) {
    if (dptr >= address && dptr < address + allocation.host_bytes) {
      if (base != nullptr) *base = address;
      if (size != nullptr) *size = allocation.host_bytes;
      found = true;
    }
  });
  return found ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

SIM_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t bytes) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (dst == 0 || (src == nullptr && bytes > 0)) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t bytes) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (src == 0 || (dst == nullptr && bytes > 0)) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, std::size_t count) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (dst == 0) return CUDA_ERROR_INVALID_VALUE;
  std::memset(reinterpret_cast<void*>(dst), value, count);
  return CUDA_SUCCESS;
}

// --- stream-ordered allocator ----------------------------------------------------------------

SIM_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Lock locked;
  Driver& state = *locked.operator->();
  if (state.default_pool[ordinal] == nullptr) state.default_pool[ordinal] = new_pool(index, true);
  *pool = reinterpret_cast<CUmemoryPool>(state.default_pool[ordinal]);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Lock locked;
  *pool = reinterpret_cast<CUmemoryPool>(current_pool_locked(*locked.operator->(), ordinal));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice ordinal, CUmemoryPool handle) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  Lock locked;
  auto* pool = reinterpret_cast<Pool*>(handle);
  if (locked->pools.find(reinterpret_cast<std::uint64_t>(pool)) == nullptr ||
      pool->device != index) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  locked->current_pool[ordinal] = pool;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* handle, const CUmemPoolProps* props) {
  if (handle == nullptr || props == nullptr || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int index = 0;
  if (CUresult status = machine_device(props->location.id, index); status != CUDA_SUCCESS) {
    return status;
  }
  Lock locked;
  Pool* pool = new_pool(index, false);
  if (pool == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  *handle = reinterpret_cast<CUmemoryPool>(pool);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  Lock locked;
  auto* pool = reinterpret_cast<Pool*>(handle);
  if (locked->pools.find(reinterpret_cast<std::uint64_t>(pool)) == nullptr || pool->is_default) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (auto& current : locked->current_pool) {
    if (current == pool) current = nullptr;
  }
  pool->destroy_pending = true;  // outstanding allocations keep it alive
  if (pool->used == 0) finish_pool_destroy_locked(*locked.operator->(), pool);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool handle, std::size_t keep) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  Lock locked;
  auto* pool = reinterpret_cast<Pool*>(handle);
  if (locked->pools.find(reinterpret_cast<std::uint64_t>(pool)) == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  shrink_pool_locked(pool, keep);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool handle, int attribute, void* value) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (injected_failure("cuMemPoolGetAttribute")) return CUDA_ERROR_UNKNOWN;
  Lock locked;
  auto* pool = reinterpret_cast<Pool*>(handle);
  if (value == nullptr || locked->pools.find(reinterpret_cast<std::uint64_t>(pool)) == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* out = static_cast<std::uint64_t*>(value);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *out = pool->release_threshold;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *out = pool->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      *out = pool->reserved_high;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *out = pool->used;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *out = pool->used_high;
      return CUDA_SUCCESS;
    case 1:
    case 2:
    case 3:  // the reuse policies, all enabled
      *static_cast<int*>(value) = 1;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

SIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool handle, int attribute, void* value) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  Lock locked;
  auto* pool = reinterpret_cast<Pool*>(handle);
  if (value == nullptr || locked->pools.find(reinterpret_cast<std::uint64_t>(pool)) == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t number = *static_cast<std::uint64_t*>(value);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      pool->release_threshold = number;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (number != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->reserved_high = pool->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (number != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->used_high = pool->used;
      return CUDA_SUCCESS;
    case 1:
    case 2:
    case 3:
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

SIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, std::size_t bytes, CUstream stream) {
  return allocate_async(dptr, bytes, stream);
}
SIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes, CUstream stream) {
  return allocate_async(dptr, bytes, stream);
}
SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, std::size_t bytes, CUmemoryPool pool,
                                            CUstream) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  return allocate_from_pool(dptr, bytes, reinterpret_cast<Pool*>(pool));
}
SIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, std::size_t bytes,
                                                 CUmemoryPool pool, CUstream stream) {
  return cuMemAllocFromPoolAsync(dptr, bytes, pool, stream);
}
SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream) {
  return free_allocation(dptr);
}
SIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream) {
  return free_allocation(dptr);
}

// --- streams and events ------------------------------------------------------------------------

SIM_EXPORT CUresult cuStreamCreate(CUstream* handle, unsigned int) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* stream = static_cast<Stream*>(std::calloc(1, sizeof(Stream)));
  if (stream == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  stream->context = context;
  *handle = reinterpret_cast<CUstream>(stream);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (reinterpret_cast<std::uintptr_t>(handle) <= 2) return CUDA_ERROR_INVALID_HANDLE;
  std::free(handle);  // queued work still completes: it is on the device's timeline
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamSynchronize(CUstream handle) {
  return synchronize_stream(handle);
}
SIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream handle) {
  return synchronize_stream(handle);
}
SIM_EXPORT CUresult cuStreamQuery(CUstream handle) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  return machine().done(context->device, stream_of(handle, context)->last_ticket, nullptr)
             ? CUDA_SUCCESS
             : CUDA_ERROR_NOT_READY;
}
SIM_EXPORT CUresult cuStreamWaitEvent(CUstream handle, CUevent handle_event, unsigned int) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  auto* event = reinterpret_cast<Event*>(handle_event);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Stream* stream = stream_of(handle, context);
  // A process's work runs in submission order: waiting for the event is running after it.
  if (event->recorded && event->ticket > stream->last_ticket) stream->last_ticket = event->ticket;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream handle, int) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  Stream* stream = stream_of(handle, context);
  if (stream == &context->default_stream) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (stream->capture != nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* graph = static_cast<Graph*>(std::calloc(1, sizeof(Graph)));
  if (graph == nullptr || !begin_capture(graph)) {
    std::free(graph);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  stream->capture = graph;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamEndCapture(CUstream handle, CUgraph* graph) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  Stream* stream = stream_of(handle, context);
  if (graph == nullptr || stream->capture == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* captured = stream->capture;
  stream->capture = nullptr;
  end_capture(captured);
  if (__atomic_load_n(&captured->invalidated, __ATOMIC_RELAXED)) {
    std::free(captured->durations);
    std::free(captured);
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  captured->capture_sequence = 0;
  *graph = reinterpret_cast<CUgraph>(captured);
  return CUDA_SUCCESS;
}
CUresult capture_status(CUstream handle, int* status) {
  Context* context = nullptr;
  if (CUresult result = require_context(context); result != CUDA_SUCCESS) return result;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Graph* capture = stream_of(handle, context)->capture;
  *status = capture == nullptr ? CU_STREAM_CAPTURE_STATUS_NONE
            : __atomic_load_n(&capture->invalidated, __ATOMIC_RELAXED)
                ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamIsCapturing(CUstream handle, int* status) {
  return capture_status(handle, status);
}
SIM_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream handle, int* status) {
  return capture_status(handle, status);
}
SIM_EXPORT CUresult cuEventCreate(CUevent* handle, unsigned int) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *handle = static_cast<CUevent>(std::calloc(1, sizeof(Event)));
  return *handle ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
// An event is a marker on its stream that the device reaches in the process's turn, after
// the process's earlier work: a process holding the device in its time slice delays
// another's events too.
SIM_EXPORT CUresult cuEventRecord(CUevent handle, CUstream handle_stream) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  auto* event = reinterpret_cast<Event*>(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Stream* stream = stream_of(handle_stream, context);
  event->device = context->device;
  event->recorded = true;
  if (stream->capture != nullptr) {  // a node of the graph being captured
    event->captured_sequence = stream->capture->capture_sequence;
    return CUDA_SUCCESS;
  }
  event->captured_sequence = 0;
  event->recorded_ns = monotonic_ns();
  event->ticket = queue_on_device(stream, 0);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuEventQuery(CUevent handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  auto* event = reinterpret_cast<Event*>(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult refused = refuse_captured_event(event); refused != CUDA_SUCCESS) return refused;
  if (!event->recorded) return CUDA_SUCCESS;
  return machine().done(event->device, event->ticket, nullptr) ? CUDA_SUCCESS
                                                               : CUDA_ERROR_NOT_READY;
}
SIM_EXPORT CUresult cuEventSynchronize(CUevent handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  auto* event = reinterpret_cast<Event*>(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult refused = refuse_captured_event(event); refused != CUDA_SUCCESS) return refused;
  if (event->recorded) machine().wait(event->device, event->ticket);
  release_pools_on_sync();
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuEventElapsedTime(float* milliseconds, CUevent start, CUevent end) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  auto* first = reinterpret_cast<Event*>(start);
  auto* second = reinterpret_cast<Event*>(end);
  if (milliseconds == nullptr || first == nullptr || second == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!first->recorded || !second->recorded) return CUDA_ERROR_INVALID_HANDLE;
  for (const Event* event : {first, second}) {
    if (CUresult refused = refuse_captured_event(event); refused != CUDA_SUCCESS) return refused;
  }
  std::uint64_t times[2];
  for (int i = 0; i < 2; ++i) {
    const Event* event = i == 0 ? first : second;
    std::uint64_t ended = 0;
    if (!machine().done(event->device, event->ticket, &ended)) return CUDA_ERROR_NOT_READY;
    times[i] = ended > event->recorded_ns ? ended : event->recorded_ns;
  }
  *milliseconds =
      static_cast<float>((static_cast<double>(times[1]) - static_cast<double>(times[0])) / 1e6);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuEventDestroy_v2(CUevent handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (handle == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::free(handle);
  return CUDA_SUCCESS;
}

// --- virtual memory management -------------------------------------------------------------------

SIM_EXPORT CUresult cuMemGetAllocationGranularity(std::size_t* granularity,
                                                  const CUmemAllocationProp* prop, int option) {
  int device = 0;
  if (CUresult status = check_allocation_prop(prop, device); status != CUDA_SUCCESS) return status;
  if (granularity == nullptr || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                 option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *granularity = kVmmGranularity;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size,
                                const CUmemAllocationProp* prop, unsigned long long flags) {
  int device = 0;
  if (CUresult status = check_allocation_prop(prop, device); status != CUDA_SUCCESS) return status;
  if (handle == nullptr || flags != 0 || size == 0 || size % kVmmGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (device >= 0) {
    if (CUresult taken = take_device_memory(device, size); taken != CUDA_SUCCESS) return taken;
  }
  char name[32];
  std::snprintf(name, sizeof name, device >= 0 ? "tessera-vmm-d%d" : "tessera-vmm-host", device);
  const int memfd = memfd_create(name, MFD_CLOEXEC);
  auto* record = static_cast<VmmHandle*>(std::calloc(1, sizeof(VmmHandle)));
  if (memfd < 0 || record == nullptr || ftruncate(memfd, static_cast<off_t>(size)) != 0) {
    if (memfd >= 0) close(memfd);
    std::free(record);
    if (device >= 0) machine().uncharge(device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *record = VmmHandle{device, size, memfd, device >= 0, false, 0};
  Lock locked;
  locked->vmm_handles.put(reinterpret_cast<std::uint64_t>(record), record);
  *handle = reinterpret_cast<std::uint64_t>(record);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  VmmHandle* record = nullptr;
  {
    Lock locked;
    record = find_vmm_handle_locked(*locked.operator->(), handle);
    if (record == nullptr || record->released) return CUDA_ERROR_INVALID_VALUE;
    record->released = true;
  }
  maybe_free_vmm_handle(record);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                                        CUdeviceptr, unsigned long long flags) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (ptr == nullptr || size == 0 || size % kVmmGranularity != 0 || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (alignment < kVmmGranularity) alignment = kVmmGranularity;
  void* region = mmap(nullptr, size + alignment, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto start = reinterpret_cast<std::uint64_t>(region);
  const std::uint64_t aligned = round_up(start, alignment);
  if (aligned > start) munmap(region, aligned - start);
  const std::uint64_t tail = start + size + alignment - (aligned + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  *ptr = aligned;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, std::size_t size) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (ptr == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  Lock locked;
  VmmHandle* record = find_vmm_handle_locked(*locked.operator->(), handle);
  if (record == nullptr || record->released || flags != 0 || ptr == 0 || size == 0 ||
      size % kVmmGranularity != 0 || offset + size > record->size ||
      locked->mappings.find(ptr) != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  void* mapped = mmap(reinterpret_cast<void*>(ptr), size, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_FIXED, record->memfd, static_cast<off_t>(offset));
  if (mapped == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
  ++record->maps;
  locked->mappings.put(ptr, Mapping{record, size});
  return CUDA_SUCCESS;
}

// The range must be exactly one or more whole, adjacent mappings.
SIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  VmmHandle* unmapped[64];
  int count = 0;
  {
    Lock locked;
    std::uint64_t covered = 0;
    for (CUdeviceptr cursor = ptr; cursor < ptr + size; cursor += covered) {
      const Mapping* found = locked->mappings.find(cursor);
      if (found == nullptr || cursor + found->size > ptr + size || count == 64) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      covered = found->size;
      ++count;
    }
    count = 0;
    for (CUdeviceptr cursor = ptr; cursor < ptr + size;) {
      Mapping mapping{};
      locked->mappings.take(cursor, mapping);
      --mapping.handle->maps;
      unmapped[count++] = mapping.handle;
      cursor += mapping.size;
    }
    mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  }
  for (int i = 0; i < count; ++i) maybe_free_vmm_handle(unmapped[i]);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                                   std::size_t count) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (ptr == 0 || size == 0 || desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemExportToShareableHandle(void* shareable,
                                                 CUmemGenericAllocationHandle handle, int type,
                                                 unsigned long long) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  Lock locked;
  VmmHandle* record = find_vmm_handle_locked(*locked.operator->(), handle);
  if (record == nullptr || shareable == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *static_cast<int*>(shareable) = fcntl(record->memfd, F_DUPFD_CLOEXEC, 0);
  return CUDA_SUCCESS;
}

// The exporter's process holds the device bytes; an importer only holds a reference.
SIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                   void* os_handle, int type) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle));
  struct stat status {};
  if (handle == nullptr || fstat(fd, &status) != 0 || status.st_size <= 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* record = static_cast<VmmHandle*>(std::calloc(1, sizeof(VmmHandle)));
  if (record == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  *record = VmmHandle{device_of_memfd(fd),
                      static_cast<std::uint64_t>(status.st_size),
                      fcntl(fd, F_DUPFD_CLOEXEC, 0),
                      false,
                      false,
                      0};
  Lock locked;
  locked->vmm_handles.put(reinterpret_cast<std::uint64_t>(record), record);
  *handle = reinterpret_cast<std::uint64_t>(record);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                           CUmemGenericAllocationHandle handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  Lock locked;
  VmmHandle* record = find_vmm_handle_locked(*locked.operator->(), handle);
  if (record == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type =
      record->device >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
  for (int ordinal = 0; ordinal < locked->device_count; ++ordinal) {
    if (locked->machine_index[ordinal] == record->device) prop->location.id = ordinal;
  }
  return CUDA_SUCCESS;
}

// --- arrays --------------------------------------------------------------------------------------

SIM_EXPORT CUresult cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  if (desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_ARRAY3D_DESCRIPTOR as3d{desc->Width,  desc->Height,      0,
                                     desc->Format, desc->NumChannels, 0};
  return create_array(reinterpret_cast<std::uint64_t*>(handle), as3d, 1);
}
SIM_EXPORT CUresult cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  if (desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return create_array(reinterpret_cast<std::uint64_t*>(handle), *desc, 1);
}
SIM_EXPORT CUresult cuArrayDestroy(CUarray handle) {
  return destroy_array(reinterpret_cast<std::uint64_t>(handle));
}
SIM_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* handle,
                                           const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned levels) {
  if (desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return create_array(reinterpret_cast<std::uint64_t*>(handle), *desc, levels);
}
SIM_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  return destroy_array(reinterpret_cast<std::uint64_t>(handle));
}
SIM_EXPORT CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* requirements,
                                                 CUarray handle, CUdevice) {
  return array_requirements(requirements, reinterpret_cast<std::uint64_t>(handle));
}
SIM_EXPORT CUresult cuMipmappedArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS* requirements, CUmipmappedArray handle, CUdevice) {
  return array_requirements(requirements, reinterpret_cast<std::uint64_t>(handle));
}

// --- modules and launches ------------------------------------------------------------------------

SIM_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *module = static_cast<CUmodule>(std::malloc(16));
  return *module ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
SIM_EXPORT CUresult cuModuleGetFunction(CUfunction* handle, CUmodule module, const char* name) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (handle == nullptr || module == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* function = static_cast<Function*>(std::calloc(1, sizeof(Function)));
  if (function == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::snprintf(function->name, sizeof function->name, "%s", name);
  function->duration_ns = duration_from_name(name);
  *handle = reinterpret_cast<CUfunction>(function);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuModuleUnload(CUmodule module) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::free(module);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned, CUstream stream, void**,
                                   void**) {
  return launch(f, gx, gy, gz, bx, by, bz, stream);
}
SIM_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, unsigned,
                                        CUstream stream, void**, void**) {
  return launch(f, gx, gy, gz, bx, by, bz, stream);
}
SIM_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void**, void**) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                config->blockDimY, config->blockDimZ, config->hStream);
}
SIM_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** p,
                                          void** e) {
  return cuLaunchKernelEx(config, f, p, e);
}
SIM_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                              unsigned bx, unsigned by, unsigned bz, unsigned,
                                              CUstream stream, void**) {
  return launch(f, gx, gy, gz, bx, by, bz, stream);
}
SIM_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                   unsigned gz, unsigned bx, unsigned by,
                                                   unsigned bz, unsigned, CUstream stream, void**) {
  return launch(f, gx, gy, gz, bx, by, bz, stream);
}
// Runs when the stream reaches it; the caller waits until then.
SIM_EXPORT CUresult cuLaunchHostFunc(CUstream handle, CUhostFn fn, void* user_data) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* stream = stream_of(handle, context);
  if (stream->capture != nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  machine().wait(context->device, stream->last_ticket);
  fn(user_data);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void* user_data) {
  return cuLaunchHostFunc(stream, fn, user_data);
}
SIM_EXPORT CUresult cuGraphCreate(CUgraph* graph, unsigned int flags) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (graph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *graph = static_cast<CUgraph>(std::calloc(1, sizeof(Graph)));
  return *graph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph handle,
                                                unsigned long long) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  auto* graph = reinterpret_cast<Graph*>(handle);
  if (exec == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* copy = static_cast<Graph*>(std::calloc(1, sizeof(Graph)));
  if (copy == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  for (int i = 0; i < graph->count; ++i) append_to_graph(copy, graph->durations[i]);
  *exec = reinterpret_cast<CUgraphExec>(copy);
  return CUDA_SUCCESS;
}
// A graph's kernels run one after another on the stream, as separate pieces of device work.
SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec handle, CUstream stream_handle) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  auto* graph = reinterpret_cast<Graph*>(handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* stream = stream_of(stream_handle, context);
  for (int i = 0; i < graph->count; ++i) {
    if (CUresult status = submit(stream, graph->durations[i]); status != CUDA_SUCCESS) {
      return status;
    }
  }
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  return cuGraphLaunch(exec, stream);
}
SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec handle) {
  auto* graph = reinterpret_cast<Graph*>(handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::free(graph->durations);
  std::free(graph);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuGraphDestroy(CUgraph handle) {
  return cuGraphExecDestroy(reinterpret_cast<CUgraphExec>(handle));
}

// --- errors
// ---------------------------------------------------------------------------------------

namespace {
struct ErrorName {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorName kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
const ErrorName* find_error(CUresult code) {
  for (const ErrorName& error : kErrors) {
    if (error.code == code) return &error;
  }
  return nullptr;
}
}  // namespace

SIM_EXPORT CUresult cuGetErrorName(CUresult code, const char** name) {
  const ErrorName* error = find_error(code);
  if (name == nullptr || error == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = error->name;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuGetErrorString(CUresult code, const char** text) {
  const ErrorName* error = find_error(code);
  if (text == nullptr || error == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *text = error->text;
  return CUDA_SUCCESS;
}

#include "simgpu/sim_proc_address.inc"
