// The simulated driver's memory: linear allocations, stream-ordered pools and arrays, each
// charged to the simulated device.
#include "simgpu/sim_cuda_internal.h"

namespace tessera::sim {

namespace {

// Guards no field: it makes an MPS client's check of its limit and its charge one step.
constinit Mutex mps_memory_lock;

void* map_host(std::uint64_t bytes, bool& mapped) {
  mapped = bytes > kSmallAllocation;
  if (!mapped) return std::aligned_alloc(kAllocationUnit, round_up(bytes, kAllocationUnit));
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return memory == MAP_FAILED ? nullptr : memory;
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

}  // namespace

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

void unmap_host(void* memory, std::uint64_t bytes, bool mapped) {
  if (mapped) {
    munmap(memory, bytes);
  } else {
    std::free(memory);
  }
}

void release_pools_on_sync() {
  Lock locked;
  locked->pools.for_each([](std::uint64_t key, char&) {
    auto* pool = reinterpret_cast<Pool*>(key);
    shrink_pool_locked(pool, pool->release_threshold);
  });
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

}  // namespace tessera::sim

using namespace tessera::sim;

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
