#include "simgpu/sim_nvml_mig_handles.h"

#include <cstdint>

namespace tessera::sim::nvml {

using namespace tessera::abi;

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

nvmlReturn_t mig_table_for_index(int device, SimMigTable& table) {
  return mig_table(handle_of(device), table);
}

char gi_handles[kMostDevices][kMigSlots];
char ci_handles[kMostDevices][kMigSlots][kMigSlots];
char mig_handles[kMostDevices][kMigSlots][kMigSlots];

MigGpuInstance* locked_gpu_instance(nvmlGpuInstance_t handle, int& device) {
  int gi = 0, unused = 0;
  if (!initialized || !decode(handle, gi_handles, kMigSlots, 1, device, gi, unused)) return nullptr;
  MigState& state = machine().lock_mig(device);
  if (state.instances[gi].used == 0) {
    machine().unlock_mig();
    return nullptr;
  }
  return &state.instances[gi];
}

bool mig_device_of(nvmlDevice_t handle, MigDeviceRef& ref) {
  return initialized &&
         decode(handle, mig_handles, kMigSlots * kMigSlots, kMigSlots, ref.device, ref.gi, ref.ci);
}

bool device_in_use(int device) {
  return machine().gpu_in_use(device);
}

bool instance_in_use(int device, int gi) {
  std::int32_t pids[1];
  std::uint64_t used[1];
  return machine().processes(mig_device_id(device, gi), pids, used, 1) > 0;
}

}  // namespace tessera::sim::nvml
