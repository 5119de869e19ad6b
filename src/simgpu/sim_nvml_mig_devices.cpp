// The simulated GPU's compute instances, inside the GPU instances of sim_nvml_mig.cpp, and a
// MIG device per compute instance, as NVIDIA's driver has them: its own handle, UUID
// (MIG-...), memory, SMs and attributes.
#include <cstdio>
#include <cstring>

#include "simgpu/sim_config.h"
#include "simgpu/sim_export.h"
#include "simgpu/sim_nvml_mig_handles.h"

using namespace tessera::abi;
using namespace tessera::sim::nvml;
using namespace tessera::sim;

namespace {

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
