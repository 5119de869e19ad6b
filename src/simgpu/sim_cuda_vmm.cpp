// The simulated driver's virtual memory management: handles, reservations, mappings and
// shareable handles.
#include "simgpu/sim_cuda_internal.h"

namespace tessera::sim {

namespace {

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

}  // namespace

}  // namespace tessera::sim

using namespace tessera::sim;

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
