// The simulated GPU's MIG, as NVIDIA's driver does it: MIG mode per device, a change pending
// until the GPU is reset while idle (tessera simgpu reset); GPU instances created by profile
// at a placement the driver picks or the caller names, refused when illegal or overlapping.
// Compute instances and MIG devices are sim_nvml_mig_devices.cpp's. The state is
// machine-wide, in the machine file.
#include <cstdio>
#include <cstring>

#include "simgpu/sim_config.h"
#include "simgpu/sim_export.h"
#include "simgpu/sim_nvml_mig_handles.h"

using namespace tessera::abi;
using namespace tessera::sim::nvml;
using namespace tessera::sim;

namespace {

// Creates a GPU instance of `profile` at `start` (or, with start < 0, at the first legal free
// placement, as the driver picks one). Under the MIG lock.
nvmlReturn_t create_gpu_instance(int device, MigState& state, const SimMigTable& table,
                                 const SimMigProfile& profile, int start,
                                 nvmlGpuInstance_t* handle) {
  if (state.current != NVML_DEVICE_MIG_ENABLE) return NVML_ERROR_INVALID_STATE;
  unsigned used_slices = 0, compute = 0, count = 0, media = 0;
  int free_slot = -1;
  for (int slot = 0; slot < kMigSlots; ++slot) {
    const MigGpuInstance& instance = state.instances[slot];
    if (instance.used == 0) {
      if (free_slot < 0) free_slot = slot;
      continue;
    }
    const SimMigProfile* other = profile_by_index(table, instance.profile);
    used_slices |= ((1u << instance.size) - 1) << instance.start;
    compute += other->compute_slices;
    count += instance.profile == profile.index;
    media += std::strstr(other->name, "+me") != nullptr;
  }
  if (free_slot < 0 || count >= profile.instances) return NVML_ERROR_INSUFFICIENT_RESOURCES;
  if (std::strstr(profile.name, "+me") != nullptr && media > 0) {
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
  }
  unsigned most_compute = 0;
  for (int i = 0; i < table.count; ++i) {
    if (table.rows[i].compute_slices > most_compute) most_compute = table.rows[i].compute_slices;
  }
  if (compute + profile.compute_slices > most_compute) return NVML_ERROR_INSUFFICIENT_RESOURCES;
  const unsigned mask = (1u << profile.size) - 1;
  if (start >= 0) {
    if (start >= 8 || ((profile.starts >> start) & 1u) == 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (((mask << start) & used_slices) != 0) return NVML_ERROR_INSUFFICIENT_RESOURCES;
  } else {
    for (int candidate = 0; candidate < 8 && start < 0; ++candidate) {
      if (((profile.starts >> candidate) & 1u) != 0 && ((mask << candidate) & used_slices) == 0) {
        start = candidate;
      }
    }
    if (start < 0) return NVML_ERROR_INSUFFICIENT_RESOURCES;
  }
  MigGpuInstance& instance = state.instances[free_slot];
  std::memset(&instance, 0, sizeof instance);
  // The driver numbers GPU instances from 1 (the whole-GPU 7g is 0); the lowest free one.
  unsigned id = profile.size == static_cast<unsigned>(memory_slices(table)) ? 0 : 1;
  for (bool taken = true; taken && profile.size != static_cast<unsigned>(memory_slices(table));) {
    taken = false;
    for (const MigGpuInstance& other : state.instances) {
      if (other.used != 0 && other.id == id) {
        taken = true;
        ++id;
      }
    }
  }
  instance.id = id;
  instance.profile = profile.index;
  instance.start = static_cast<unsigned>(start);
  instance.size = profile.size;
  instance.serial = ++state.next_serial;
  instance.compute_slices = profile.compute_slices;
  instance.sms = profile.sms;
  instance.memory_mib = profile.memory_mib;
  std::snprintf(instance.name, sizeof instance.name, "%s", profile.name);
  instance.used = 1;
  if (handle != nullptr)
    *handle = reinterpret_cast<nvmlGpuInstance_t>(&gi_handles[device][free_slot]);
  return NVML_SUCCESS;
}

nvmlReturn_t create(nvmlDevice_t device, unsigned profile_id, int start,
                    nvmlGpuInstance_t* handle) {
  if (tessera::sim::injected_failure("nvmlDeviceCreateGpuInstance")) return NVML_ERROR_UNKNOWN;
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  SimMigTable table{};
  if (nvmlReturn_t status = mig_table(device, table); status != NVML_SUCCESS) return status;
  if (handle == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const SimMigProfile* profile = profile_by_id(table, profile_id);
  if (profile == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  MigState& state = machine().lock_mig(index);
  const nvmlReturn_t status = create_gpu_instance(index, state, table, *profile, start, handle);
  machine().unlock_mig();
  return status;
}

}  // namespace

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int* current,
                                             unsigned int* pending) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  if (current == nullptr || pending == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (machine().spec().devices[index].mig_family < 0) return NVML_ERROR_NOT_SUPPORTED;
  const MigState& state = machine().lock_mig(index);
  *current = state.current;
  *pending = state.pending;
  machine().unlock_mig();
  return NVML_SUCCESS;
}

// The new mode is pending until the GPU is reset (activationStatus says so); MIG cannot be
// turned off while GPU instances exist.
SIM_EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                             nvmlReturn_t* activation) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  if (machine().spec().devices[index].mig_family < 0) return NVML_ERROR_NOT_SUPPORTED;
  if (activation == nullptr || mode > NVML_DEVICE_MIG_ENABLE) return NVML_ERROR_INVALID_ARGUMENT;
  MigState& state = machine().lock_mig(index);
  nvmlReturn_t status = NVML_SUCCESS;
  bool instances = false;
  for (const MigGpuInstance& instance : state.instances) instances |= instance.used != 0;
  if (mode == NVML_DEVICE_MIG_DISABLE && instances) {
    status = NVML_ERROR_IN_USE;
  } else {
    state.pending = mode;
    *activation = state.current == mode ? NVML_SUCCESS : NVML_ERROR_RESET_REQUIRED;
  }
  machine().unlock_mig();
  return status;
}

// `tessera simgpu reset`: as nvidia-smi -r, refused while any process uses the GPU; applies
// a pending MIG mode (instances go with it).
SIM_EXPORT nvmlReturn_t tesseraSimResetDevice(unsigned int index) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (index >= static_cast<unsigned>(machine().spec().device_count)) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  if (device_in_use(static_cast<int>(index))) return NVML_ERROR_IN_USE;
  MigState& state = machine().lock_mig(static_cast<int>(index));
  if (state.pending != state.current) {
    state.current = state.pending;
    for (MigGpuInstance& instance : state.instances) instance.used = 0;
  }
  machine().unlock_mig();
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(
    nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_v2_t* info) {
  SimMigTable table{};
  if (nvmlReturn_t status = mig_table(device, table); status != NVML_SUCCESS) return status;
  if (info == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (info->version != nvmlGpuInstanceProfileInfo_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  for (int i = 0; i < table.count; ++i) {
    const SimMigProfile& row = table.rows[i];
    if (row.index != profile) continue;
    std::memset(info, 0, sizeof *info);
    info->version = nvmlGpuInstanceProfileInfo_v2;
    info->id = row.id;
    info->sliceCount = row.compute_slices;
    info->instanceCount = row.instances;
    info->multiprocessorCount = row.sms;
    info->memorySizeMB = row.memory_mib;
    std::snprintf(info->name, sizeof info->name, "%s", row.name);
    return NVML_SUCCESS;
  }
  return profile < 16 ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

// With `placements` null, says how many there are; else fills up to *count of them.
SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profile_id, nvmlGpuInstancePlacement_t* placements,
    unsigned int* count) {
  SimMigTable table{};
  if (nvmlReturn_t status = mig_table(device, table); status != NVML_SUCCESS) return status;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < table.count; ++i) {
    const SimMigProfile& row = table.rows[i];
    if (row.id != profile_id) continue;
    const unsigned total = static_cast<unsigned>(__builtin_popcount(row.starts));
    if (placements == nullptr) {
      *count = total;
      return NVML_SUCCESS;
    }
    if (*count < total) {
      *count = total;
      return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned written = 0;
    for (unsigned start = 0; start < 8; ++start) {
      if ((row.starts >> start) & 1u) placements[written++] = {start, row.size};
    }
    *count = written;
    return NVML_SUCCESS;
  }
  return NVML_ERROR_INVALID_ARGUMENT;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profile_id,
                                                    nvmlGpuInstance_t* instance) {
  return create(device, profile_id, -1, instance);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profile_id, const nvmlGpuInstancePlacement_t* placement,
    nvmlGpuInstance_t* instance) {
  if (placement == nullptr || placement->start >= 8) return NVML_ERROR_INVALID_ARGUMENT;
  SimMigTable table{};
  if (nvmlReturn_t status = mig_table(device, table); status != NVML_SUCCESS) return status;
  const SimMigProfile* profile = profile_by_id(table, profile_id);
  if (profile == nullptr || placement->size != profile->size) return NVML_ERROR_INVALID_ARGUMENT;
  return create(device, profile_id, static_cast<int>(placement->start), instance);
}

// The GPU instances of one profile (by ID), in slot order.
SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profile_id,
                                                  nvmlGpuInstance_t* instances,
                                                  unsigned int* count) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  SimMigTable table{};
  if (nvmlReturn_t status = mig_table(device, table); status != NVML_SUCCESS) return status;
  const SimMigProfile* profile = profile_by_id(table, profile_id);
  if (profile == nullptr || count == nullptr || instances == nullptr) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  const MigState& state = machine().lock_mig(index);
  unsigned found = 0;
  for (int slot = 0; slot < kMigSlots; ++slot) {
    const MigGpuInstance& instance = state.instances[slot];
    if (instance.used == 0 || instance.profile != profile->index) continue;
    if (found < *count) {
      instances[found] = reinterpret_cast<nvmlGpuInstance_t>(&gi_handles[index][slot]);
    }
    ++found;
  }
  machine().unlock_mig();
  const bool fits = found <= *count;
  *count = found;
  return fits ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t handle,
                                               nvmlGpuInstanceInfo_t* info) {
  if (info == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  int device = 0;
  const MigGpuInstance* instance = locked_gpu_instance(handle, device);
  if (instance == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  SimMigTable table{};
  mig_table_for_index(device, table);
  info->device = handle_of(device);
  info->id = instance->id;
  info->profileId = profile_by_index(table, instance->profile)->id;
  info->placement = {instance->start, instance->size};
  machine().unlock_mig();
  return NVML_SUCCESS;
}

// Refused while it has compute instances, as the driver does (destroy those first).
SIM_EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t handle) {
  int device = 0;
  MigGpuInstance* instance = locked_gpu_instance(handle, device);
  if (instance == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  bool computing = false;
  for (const MigComputeInstance& compute : instance->compute) computing |= compute.used != 0;
  if (!computing) instance->used = 0;
  machine().unlock_mig();
  return computing ? NVML_ERROR_IN_USE : NVML_SUCCESS;
}
