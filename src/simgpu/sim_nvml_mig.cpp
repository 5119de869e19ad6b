// The simulated GPU's MIG, as NVIDIA's driver does it: MIG mode per device, a change pending
// until the GPU is reset while idle (tessera simgpu reset); GPU instances created by profile
// at a placement the driver picks or the caller names, refused when illegal or overlapping;
// compute instances inside them; and a MIG device per compute instance, with its own handle,
// UUID (MIG-...), memory and SMs. The state is machine-wide, in the machine file.
#include <cstdio>
#include <cstring>

#include "cuda_abi/nvml_abi.h"
#include "simgpu/sim_config.h"
#include "simgpu/sim_machine.h"
#include "simgpu/sim_mig_tables.h"
#include "simgpu/sim_nvml.h"

using namespace tessera::abi;
using namespace tessera::sim::nvml;
using tessera::sim::kComputeProfileSlices;
using tessera::sim::kMigSlots;
using tessera::sim::kMigTables;
using tessera::sim::machine;
using tessera::sim::memory_slices;
using tessera::sim::MigComputeInstance;
using tessera::sim::MigGpuInstance;
using tessera::sim::MigState;
using tessera::sim::profile_by_id;
using tessera::sim::profile_by_index;
using tessera::sim::SimMigProfile;
using tessera::sim::SimMigTable;

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// The device's MIG table, or a status saying why it has none.
nvmlReturn_t mig_table(nvmlDevice_t device, SimMigTable& table) {
  int index = 0;
  if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
  const int family = machine().spec().devices[index].mig_family;
  if (family < 0 || family >= static_cast<int>(sizeof kMigTables / sizeof kMigTables[0])) {
    return NVML_ERROR_NOT_SUPPORTED;
  }
  table = kMigTables[family];
  return NVML_SUCCESS;
}

// Handles: GPU instances, compute instances and MIG devices point into these arrays.
char gi_handles[tessera::kMostDevices][kMigSlots];
char ci_handles[tessera::kMostDevices][kMigSlots][kMigSlots];
char mig_handles[tessera::kMostDevices][kMigSlots][kMigSlots];

template <typename Array>
bool decode(const void* handle, const Array& array, std::size_t per_device, std::size_t per_gi,
            int& device, int& gi, int& ci) {
  const char* base = reinterpret_cast<const char*>(&array);
  const char* at = static_cast<const char*>(handle);
  if (at < base || at >= base + sizeof array) return false;
  const std::size_t offset = static_cast<std::size_t>(at - base);
  device = static_cast<int>(offset / per_device);
  gi = static_cast<int>(offset % per_device / per_gi);
  ci = static_cast<int>(offset % per_gi);
  return device < machine().spec().device_count;
}

// A handle's instance, under the MIG lock (taken here, released by the caller with
// machine().unlock_mig()); null, unlocked, when the handle names none that exists.
MigGpuInstance* locked_gpu_instance(nvmlGpuInstance_t handle, int& device)
    TRY_ACQUIRE(true, machine().mig_lock()) {
  int gi = 0, unused = 0;
  if (!initialized || !decode(handle, gi_handles, kMigSlots, 1, device, gi, unused)) return nullptr;
  MigState& state = machine().lock_mig(device);
  if (state.instances[gi].used == 0) {
    machine().unlock_mig();
    return nullptr;
  }
  return &state.instances[gi];
}

struct MigDeviceRef {
  int device = 0, gi = 0, ci = 0;
};
bool mig_device_of(nvmlDevice_t handle, MigDeviceRef& ref) {
  return initialized &&
         decode(handle, mig_handles, kMigSlots * kMigSlots, kMigSlots, ref.device, ref.gi, ref.ci);
}

// Whether any process holds memory on the GPU or in one of its instances (a context is
// enough).
bool device_in_use(int device) {
  return machine().gpu_in_use(device);
}

// Whether any process holds memory in GPU instance `gi` of the device.
bool instance_in_use(int device, int gi) {
  std::int32_t pids[1];
  std::uint64_t used[1];
  return machine().processes(tessera::sim::mig_device_id(device, gi), pids, used, 1) > 0;
}

nvmlReturn_t mig_table_for_index(int device, SimMigTable& table) {
  return mig_table(handle_of(device), table);
}

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

// The MIG device's instance and compute instance, under the MIG lock; false (unlocked) when
// they are gone.
bool locked_mig_device(nvmlDevice_t handle, MigDeviceRef& ref, MigGpuInstance*& gi,
                       MigComputeInstance*& ci) TRY_ACQUIRE(true, machine().mig_lock()) {
  if (!mig_device_of(handle, ref)) return false;
  MigState& state = machine().lock_mig(ref.device);
  gi = &state.instances[ref.gi];
  ci = &gi->compute[ref.ci];
  if (gi->used == 0 || ci->used == 0) {
    machine().unlock_mig();
    return false;
  }
  return true;
}

}  // namespace

namespace tessera::sim::nvml {

bool is_mig_handle(nvmlDevice_t device) {
  MigDeviceRef ref;
  return mig_device_of(device, ref);
}

nvmlReturn_t mig_device_name(nvmlDevice_t device, char* name, unsigned length) {
  MigDeviceRef ref;
  MigGpuInstance* gi = nullptr;
  MigComputeInstance* ci = nullptr;
  if (!locked_mig_device(device, ref, gi, ci)) return NVML_ERROR_INVALID_ARGUMENT;
  SimMigTable table{};
  mig_table_for_index(ref.device, table);
  const SimMigProfile* profile = profile_by_index(table, gi->profile);
  machine().unlock_mig();
  char text[96];
  std::snprintf(text, sizeof text, "%s %s", machine().spec().devices[ref.device].name,
                profile->name);  // "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
  return copy_string(name, length, text);
}

nvmlReturn_t mig_device_uuid(nvmlDevice_t device, char* uuid, unsigned length) {
  MigDeviceRef ref;
  MigGpuInstance* gi = nullptr;
  MigComputeInstance* ci = nullptr;
  if (!locked_mig_device(device, ref, gi, ci)) return NVML_ERROR_INVALID_ARGUMENT;
  char text[48];
  tessera::sim::format_mig_uuid(ref.device, *gi, ref.ci, text, sizeof text);
  machine().unlock_mig();
  return copy_string(uuid, length, text);
}

nvmlReturn_t mig_device_memory(nvmlDevice_t device, nvmlMemory_t* memory) {
  MigDeviceRef ref;
  MigGpuInstance* gi = nullptr;
  MigComputeInstance* ci = nullptr;
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (!locked_mig_device(device, ref, gi, ci)) return NVML_ERROR_INVALID_ARGUMENT;
  SimMigTable table{};
  mig_table_for_index(ref.device, table);
  const std::uint64_t total = profile_by_index(table, gi->profile)->memory_mib << 20;
  machine().unlock_mig();
  const std::uint64_t used = machine().used(tessera::sim::mig_device_id(ref.device, ref.gi));
  memory->total = total;
  memory->used = used < total ? used : total;
  memory->free = total - memory->used;
  return NVML_SUCCESS;
}

int mig_processes(nvmlDevice_t device, int gpu, MigProcess* out, int capacity) {
  MigDeviceRef ref;
  const bool one = mig_device_of(device, ref);
  if (one) gpu = ref.device;
  if (gpu < 0 || gpu >= machine().spec().device_count) return 0;
  // The instances' IDs first, under the MIG lock; the accounts are read after it.
  unsigned gi_ids[kMigSlots] = {}, ci_ids[kMigSlots] = {};
  bool wanted[kMigSlots] = {};
  const MigState& state = machine().lock_mig(gpu);
  for (int slot = 0; slot < kMigSlots; ++slot) {
    const MigGpuInstance& instance = state.instances[slot];
    wanted[slot] = instance.used != 0 && (!one || slot == ref.gi);
    gi_ids[slot] = instance.id;
    ci_ids[slot] = one ? static_cast<unsigned>(ref.ci) : 0;
    for (int ci = kMigSlots - 1; !one && ci >= 0; --ci) {
      if (instance.compute[ci].used != 0) ci_ids[slot] = static_cast<unsigned>(ci);
    }
  }
  machine().unlock_mig();
  int found = 0;
  for (int slot = 0; slot < kMigSlots; ++slot) {
    if (!wanted[slot]) continue;
    std::int32_t pids[tessera::kMostMembers];
    std::uint64_t used[tessera::kMostMembers];
    const int here = machine().processes(tessera::sim::mig_device_id(gpu, slot), pids, used,
                                         tessera::kMostMembers);
    for (int i = 0; i < here && i < tessera::kMostMembers; ++i, ++found) {
      if (found < capacity) {
        out[found] = {static_cast<unsigned>(pids[i]), used[i], gi_ids[slot], ci_ids[slot]};
      }
    }
  }
  return found;
}

nvmlReturn_t mig_parent(nvmlDevice_t device, nvmlDevice_t& parent) {
  MigDeviceRef ref;
  if (!mig_device_of(device, ref)) return NVML_ERROR_INVALID_ARGUMENT;
  parent = handle_of(ref.device);
  return NVML_SUCCESS;
}

}  // namespace tessera::sim::nvml

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

SIM_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                   nvmlDeviceAttributes_t* attributes) {
  if (attributes == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  MigDeviceRef ref;
  MigGpuInstance* gi = nullptr;
  MigComputeInstance* ci = nullptr;
  if (!is_mig_handle(device)) {
    // A whole GPU has no attributes in NVML's sense: an H200 answers NOT_SUPPORTED (driver
    // 580.159.04), and so does the simulated one.
    int index = 0;
    if (nvmlReturn_t status = device_index(device, index); status != NVML_SUCCESS) return status;
    return NVML_ERROR_NOT_SUPPORTED;
  }
  if (!locked_mig_device(device, ref, gi, ci)) return NVML_ERROR_INVALID_ARGUMENT;
  SimMigTable table{};
  mig_table_for_index(ref.device, table);
  const SimMigProfile* profile = profile_by_index(table, gi->profile);
  std::memset(attributes, 0, sizeof *attributes);
  attributes->gpuInstanceSliceCount = profile->compute_slices;
  attributes->computeInstanceSliceCount = ci->size;
  attributes->multiprocessorCount = profile->sms * ci->size / profile->compute_slices;
  attributes->memorySizeMB = profile->memory_mib;
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

// Compute instance profiles: N compute slices of the GPU instance's, N one it has.
SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t handle, unsigned int profile, unsigned int engine,
    nvmlComputeInstanceProfileInfo_v2_t* info) {
  if (info == nullptr || engine != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  if (info->version != nvmlComputeInstanceProfileInfo_v2)
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  int device = 0;
  const MigGpuInstance* instance = locked_gpu_instance(handle, device);
  if (instance == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  SimMigTable table{};
  mig_table_for_index(device, table);
  const SimMigProfile& gi = *profile_by_index(table, instance->profile);
  machine().unlock_mig();
  if (profile >= sizeof kComputeProfileSlices / sizeof kComputeProfileSlices[0]) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  const unsigned slices = kComputeProfileSlices[profile];
  if (slices > gi.compute_slices || (slices > 4 && slices != gi.compute_slices)) {
    return NVML_ERROR_NOT_SUPPORTED;
  }
  std::memset(info, 0, sizeof *info);
  info->version = nvmlComputeInstanceProfileInfo_v2;
  info->id = profile;
  info->sliceCount = slices;
  info->instanceCount = gi.compute_slices / slices;
  info->multiprocessorCount = gi.sms * slices / gi.compute_slices;
  // "MIG 1c.3g.40gb"; the whole GPU instance's is named as the instance is.
  const char* size = std::strchr(gi.name, '.');
  if (slices == gi.compute_slices) {
    std::snprintf(info->name, sizeof info->name, "%s", gi.name);
  } else {
    std::snprintf(info->name, sizeof info->name, "MIG %uc.%ug%s", slices, gi.compute_slices,
                  size != nullptr ? size : "");
  }
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t handle,
                                                             unsigned int profile,
                                                             nvmlComputeInstance_t* created) {
  if (created == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (tessera::sim::injected_failure("nvmlGpuInstanceCreateComputeInstance")) {
    return NVML_ERROR_UNKNOWN;
  }
  nvmlComputeInstanceProfileInfo_v2_t info{};
  info.version = nvmlComputeInstanceProfileInfo_v2;
  if (nvmlReturn_t status =
          nvmlGpuInstanceGetComputeInstanceProfileInfoV(handle, profile, 0, &info);
      status != NVML_SUCCESS) {
    return status;
  }
  int device = 0;
  MigGpuInstance* instance = locked_gpu_instance(handle, device);
  if (instance == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const int gi_slot = static_cast<int>(reinterpret_cast<const char*>(handle) - gi_handles[device]);
  unsigned used = 0;
  int free_slot = -1;
  for (int slot = 0; slot < kMigSlots; ++slot) {
    const MigComputeInstance& compute = instance->compute[slot];
    if (compute.used != 0) {
      used |= ((1u << compute.size) - 1) << compute.start;
    } else if (free_slot < 0) {
      free_slot = slot;
    }
  }
  // The first run of free compute slices, aligned to its size.
  int start = -1;
  const unsigned mask = (1u << info.sliceCount) - 1;
  for (unsigned at = 0; at + info.sliceCount <= info.sliceCount * info.instanceCount && start < 0;
       at += info.sliceCount) {
    if (((mask << at) & used) == 0) start = static_cast<int>(at);
  }
  nvmlReturn_t status = NVML_ERROR_INSUFFICIENT_RESOURCES;
  if (free_slot >= 0 && start >= 0) {
    instance->compute[free_slot] = {1, profile, static_cast<unsigned>(start), info.sliceCount,
                                    info.multiprocessorCount};
    *created = reinterpret_cast<nvmlComputeInstance_t>(&ci_handles[device][gi_slot][free_slot]);
    status = NVML_SUCCESS;
  }
  machine().unlock_mig();
  return status;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t handle,
                                                           unsigned int profile,
                                                           nvmlComputeInstance_t* instances,
                                                           unsigned int* count) {
  if (instances == nullptr || count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  int device = 0;
  const MigGpuInstance* instance = locked_gpu_instance(handle, device);
  if (instance == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const int gi_slot = static_cast<int>(reinterpret_cast<const char*>(handle) - gi_handles[device]);
  unsigned found = 0;
  for (int slot = 0; slot < kMigSlots; ++slot) {
    const MigComputeInstance& compute = instance->compute[slot];
    if (compute.used == 0 || compute.profile != profile) continue;
    if (found < *count) {
      instances[found] =
          reinterpret_cast<nvmlComputeInstance_t>(&ci_handles[device][gi_slot][slot]);
    }
    ++found;
  }
  machine().unlock_mig();
  const bool fits = found <= *count;
  *count = found;
  return fits ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

namespace {

// A compute instance handle's GPU instance and itself, under the MIG lock (see above).
MigComputeInstance* locked_compute_instance(nvmlComputeInstance_t handle, int& device, int& gi,
                                            int& ci) TRY_ACQUIRE(true, machine().mig_lock()) {
  if (!initialized ||
      !decode(handle, ci_handles, kMigSlots * kMigSlots, kMigSlots, device, gi, ci)) {
    return nullptr;
  }
  MigState& state = machine().lock_mig(device);
  MigComputeInstance* compute = &state.instances[gi].compute[ci];
  if (state.instances[gi].used == 0 || compute->used == 0) {
    machine().unlock_mig();
    return nullptr;
  }
  return compute;
}

}  // namespace

SIM_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t handle,
                                                      nvmlComputeInstanceInfo_t* info) {
  if (info == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  int device = 0, gi = 0, ci = 0;
  const MigComputeInstance* compute = locked_compute_instance(handle, device, gi, ci);
  if (compute == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  info->device = handle_of(device);
  info->gpuInstance = reinterpret_cast<nvmlGpuInstance_t>(&gi_handles[device][gi]);
  info->id = static_cast<unsigned>(ci);
  info->profileId = compute->profile;
  info->placement = {compute->start, compute->size};
  machine().unlock_mig();
  return NVML_SUCCESS;
}

// Refused while a process holds memory in its GPU instance (the simulated accounts are per
// GPU instance: a process on another compute instance of the same one counts too).
SIM_EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t handle) {
  int device = 0, gi = 0, ci = 0;
  if (!initialized ||
      !decode(handle, ci_handles, kMigSlots * kMigSlots, kMigSlots, device, gi, ci)) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  if (instance_in_use(device, gi)) return NVML_ERROR_IN_USE;
  MigComputeInstance* compute = locked_compute_instance(handle, device, gi, ci);
  if (compute == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  compute->used = 0;
  machine().unlock_mig();
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int* count) {
  SimMigTable table{};
  if (nvmlReturn_t status = mig_table(device, table); status != NVML_SUCCESS) return status;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned most = 0;
  for (int i = 0; i < table.count; ++i) {
    if (table.rows[i].compute_slices > most) most = table.rows[i].compute_slices;
  }
  *count = most;  // one MIG device per compute slice at most
  return NVML_SUCCESS;
}

// The index-th MIG device: compute instances in GPU-instance slot order.
SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                            nvmlDevice_t* mig_device) {
  int machine_index = 0;
  if (nvmlReturn_t status = device_index(device, machine_index); status != NVML_SUCCESS) {
    return status;
  }
  if (mig_device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const MigState& state = machine().lock_mig(machine_index);
  nvmlReturn_t status = NVML_ERROR_NOT_FOUND;
  unsigned seen = 0;
  for (int gi = 0; gi < kMigSlots && status != NVML_SUCCESS; ++gi) {
    if (state.instances[gi].used == 0) continue;
    for (int ci = 0; ci < kMigSlots && status != NVML_SUCCESS; ++ci) {
      if (state.instances[gi].compute[ci].used == 0) continue;
      if (seen++ == index) {
        *mig_device = reinterpret_cast<nvmlDevice_t>(&mig_handles[machine_index][gi][ci]);
        status = NVML_SUCCESS;
      }
    }
  }
  machine().unlock_mig();
  return status;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig_device,
                                                                     nvmlDevice_t* device) {
  MigDeviceRef ref;
  if (device == nullptr || !mig_device_of(mig_device, ref)) return NVML_ERROR_INVALID_ARGUMENT;
  *device = handle_of(ref.device);
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int* is_mig) {
  if (is_mig == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *is_mig = is_mig_handle(device) ? 1 : 0;
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int* id) {
  MigDeviceRef ref;
  MigGpuInstance* gi = nullptr;
  MigComputeInstance* ci = nullptr;
  if (id == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (!is_mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
  if (!locked_mig_device(device, ref, gi, ci)) return NVML_ERROR_INVALID_ARGUMENT;
  *id = gi->id;
  machine().unlock_mig();
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int* id) {
  MigDeviceRef ref;
  if (id == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (!mig_device_of(device, ref)) return NVML_ERROR_NOT_SUPPORTED;
  *id = static_cast<unsigned>(ref.ci);
  return NVML_SUCCESS;
}
