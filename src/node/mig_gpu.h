// MIG on this machine's GPUs, through NVML: what each GPU has (mode, GPU instances at their
// placements, compute instances, MIG devices, whether processes use them), and the changes
// tessera mig makes: the mode, then GPU instances created at the placements the planner chose,
// each with one compute instance over all of it, undone on any failure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mig/planner.h"
#include "node/nvml.h"

namespace tessera::node {

struct MigDevice {
  std::string uuid;  // "MIG-..."
  unsigned compute_instance = 0;
  std::uint64_t memory_bytes = 0;
  int sm_count = 0;
};

struct MigInstance {
  mig::Existing existing;  // its profile (in MigGpu::model), start, GPU instance ID, in use
  std::vector<MigDevice> devices;
};

struct MigGpu {
  GpuInfo gpu;
  bool enabled = false;             // MIG mode now
  bool pending_enabled = false;     // after the next reset
  std::uint32_t pci_device_id = 0;  // device << 16 | vendor, as mig-parted's device-filter
  std::shared_ptr<const mig::GpuModel> model;  // its profiles, as NVML reports them
  std::vector<MigInstance> instances;
  std::vector<unsigned> processes;  // PIDs using the GPU (or its MIG devices)

  std::vector<mig::Existing> existing() const;
  mig::Layout layout() const;
};

// Fills in the MIG devices of every GPU with MIG on, in GPU instance order (as NVIDIA's
// plugin lists them). Throws std::runtime_error naming the GPU and the call that failed.
void add_mig_devices(Nvml& nvml, Inventory& inventory);

// Reads one MIG-capable GPU's state. Throws std::runtime_error naming the GPU and the call
// that failed.
MigGpu read_mig_gpu(Nvml& nvml, const GpuInfo& gpu);

// Asks for MIG mode on or off. Returns false when the change waits for a GPU reset.
bool set_mig_mode(Nvml& nvml, const MigGpu& gpu, bool enabled);

// Carries out the steps (destroys, then creates at the planned placements). On a failure,
// undoes what it did, newest first, and throws std::runtime_error saying which step failed
// and whether the GPU is back as it was.
void apply_steps(Nvml& nvml, const MigGpu& gpu, const std::vector<mig::Step>& steps);

}  // namespace tessera::node
