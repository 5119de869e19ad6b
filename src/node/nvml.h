// NVML as the node agent uses it, loaded at run time: NVIDIA's libnvidia-ml.so.1 where a
// driver is installed, the simulated one otherwise. Nothing links against it, so one binary
// serves machines with and without a driver.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuda_abi/nvml_abi.h"

namespace tessera::node {

class Nvml {
 public:
  // Loads `library` (a name the loader finds, or a path) and initialises it. Throws
  // std::runtime_error saying why it cannot.
  explicit Nvml(const std::string& library);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool simulated() const { return simulated_; }
  const std::string& library() const { return library_; }
  std::string error_text(abi::nvmlReturn_t status) const;

#define TESSERA_NVML_MEMBER(name, params) abi::PFN_##name name = nullptr;
  TESSERA_NVML_PASSTHROUGH(TESSERA_NVML_MEMBER)
  TESSERA_NVML_INVENTORY(TESSERA_NVML_MEMBER)
  TESSERA_NVML_MIG(TESSERA_NVML_MEMBER)
  abi::PFN_nvmlDeviceGetMemoryInfo nvmlDeviceGetMemoryInfo = nullptr;
  abi::PFN_nvmlDeviceGetComputeRunningProcesses_v3 nvmlDeviceGetComputeRunningProcesses_v3 =
      nullptr;
#undef TESSERA_NVML_MEMBER

 private:
  void* handle_ = nullptr;
  std::string library_;
  bool simulated_ = false;
  const char* (*error_string_)(abi::nvmlReturn_t) = nullptr;
};

// A MIG device of a GPU (one compute instance of a GPU instance).
struct MigDeviceInfo {
  std::string uuid;     // "MIG-..."
  std::string profile;  // "1g.10gb", "1g.10gb+me"
  int index = 0;        // its place among the GPU's MIG devices: "<gpu>:<index>" names it
  unsigned gpu_instance = 0, compute_instance = 0;
  int start = -1;  // its GPU instance's placement, in memory slices; -1 where not read
  std::uint64_t memory_bytes = 0;
  int sm_count = 0;
};

// What the node agent knows of one GPU.
struct GpuInfo {
  unsigned index = 0;
  std::string uuid;
  std::string name;        // "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;  // "00000000:17:00.0"
  std::uint64_t memory_bytes = 0;
  std::uint64_t memory_used = 0;  // when the inventory was read
  int cc_major = 0, cc_minor = 0;
  int numa_node = -1;  // -1: none reported
  bool mig_capable = false;
  bool mig_enabled = false;
  std::vector<MigDeviceInfo> mig_devices;  // with MIG on (add_mig_devices reads them)
};

struct Inventory {
  std::vector<GpuInfo> gpus;
  std::string driver_version;          // "580.65.06"
  int cuda_major = 0, cuda_minor = 0;  // the CUDA version the driver supports
  bool simulated = false;
};

// Reads every GPU NVML reports. Throws std::runtime_error naming the GPU and the call that
// failed; optional facts (SMs, NUMA node, MIG mode) are left unknown where NVML lacks them.
Inventory read_inventory(Nvml& nvml);

// A device event as the health monitor sees it.
struct DeviceEvent {
  int gpu = -1;  // index; -1: NVML could not say which device
  std::uint64_t type = 0;
  std::uint64_t data = 0;
};

// An NVML event set over every GPU of an inventory.
class EventSet {
 public:
  // Registers `types` (nvmlEventType*) on each GPU that supports them; GPUs that cannot be
  // watched are listed in `unwatched` with the reason.
  EventSet(Nvml& nvml, const Inventory& inventory, std::uint64_t types);
  ~EventSet();
  EventSet(const EventSet&) = delete;
  EventSet& operator=(const EventSet&) = delete;

  enum class Outcome { event, timeout, failed };
  // Waits up to timeout_ms for an event; on `failed`, `error` says why.
  Outcome wait(unsigned timeout_ms, DeviceEvent& event, std::string& error);
  const std::vector<std::pair<int, std::string>>& unwatched() const { return unwatched_; }

 private:
  Nvml& nvml_;
  abi::nvmlEventSet_t set_ = nullptr;
  std::vector<std::string> uuids_;  // by GPU index, to name an event's device
  std::vector<std::pair<int, std::string>> unwatched_;
};

}  // namespace tessera::node
