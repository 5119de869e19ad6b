// The simulated NVML's MIG handles and the lookups its two MIG chapters share:
// sim_nvml_mig.cpp (MIG modes and GPU instances) and sim_nvml_mig_devices.cpp (compute
// instances and the MIG devices on them). Handles are addresses in arrays here, so that a
// handle is decoded to its device, GPU instance and compute instance without a table.
#pragma once

#include <cstddef>

#include "common/limits.h"
#include "cuda_abi/nvml_abi.h"
#include "simgpu/sim_machine.h"
#include "simgpu/sim_mig_tables.h"
#include "simgpu/sim_nvml.h"

namespace tessera::sim::nvml {

// The device's MIG table, or a status saying why it has none.
abi::nvmlReturn_t mig_table(abi::nvmlDevice_t device, SimMigTable& table);
abi::nvmlReturn_t mig_table_for_index(int device, SimMigTable& table);

// Handles: GPU instances, compute instances and MIG devices point into these arrays.
extern char gi_handles[kMostDevices][kMigSlots];
extern char ci_handles[kMostDevices][kMigSlots][kMigSlots];
extern char mig_handles[kMostDevices][kMigSlots][kMigSlots];

// The device, GPU instance and compute instance a handle into `array` names; false if it is
// not one of its addresses.
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
MigGpuInstance* locked_gpu_instance(abi::nvmlGpuInstance_t handle, int& device)
    TRY_ACQUIRE(true, machine().mig_lock());

struct MigDeviceRef {
  int device = 0, gi = 0, ci = 0;
};
bool mig_device_of(abi::nvmlDevice_t handle, MigDeviceRef& ref);

// Whether any process holds memory on the GPU or in one of its instances (a context is
// enough).
bool device_in_use(int device);
// Whether any process holds memory in GPU instance `gi` of the device.
bool instance_in_use(int device, int gi);

}  // namespace tessera::sim::nvml
