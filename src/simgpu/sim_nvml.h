// What the simulated NVML's two files share: device handles, and MIG device handles, which
// NVML's calls on a device accept too (sim_nvml_mig.cpp).
#pragma once

#include "cuda_abi/nvml_abi.h"

namespace tessera::sim::nvml {

extern bool initialized;

// The machine device a whole-GPU handle names; NVML_ERROR_INVALID_ARGUMENT for any other.
abi::nvmlReturn_t device_index(abi::nvmlDevice_t device, int& index);
abi::nvmlDevice_t handle_of(int index);
abi::nvmlReturn_t copy_string(char* out, unsigned length, const char* text);

// A MIG device handle: what it reports in place of a whole GPU's name, UUID and memory.
bool is_mig_handle(abi::nvmlDevice_t device);
abi::nvmlReturn_t mig_device_name(abi::nvmlDevice_t device, char* name, unsigned length);
abi::nvmlReturn_t mig_device_uuid(abi::nvmlDevice_t device, char* uuid, unsigned length);
abi::nvmlReturn_t mig_device_memory(abi::nvmlDevice_t device, abi::nvmlMemory_t* memory);
abi::nvmlReturn_t mig_parent(abi::nvmlDevice_t device, abi::nvmlDevice_t& parent);

// A process holding memory in a GPU instance, with the instance's IDs.
struct MigProcess {
  unsigned pid;
  unsigned long long used;
  unsigned gpu_instance, compute_instance;
};
// The processes in a MIG device's GPU instance, or in every instance of GPU `gpu` when
// `device` is no MIG handle; stores up to `capacity`, returns how many there are.
int mig_processes(abi::nvmlDevice_t device, int gpu, MigProcess* out, int capacity);

}  // namespace tessera::sim::nvml
