// GPU check: what the node agent reads of a real GPU through NVML (its inventory and whether
// its health events can be watched), and the GPU's MIG profile catalog as the driver reports
// it beside Tessera's built-in one. Read-only: it changes no setting of the GPU.
// Usage: nvml_probe [LIBRARY]   (default libnvidia-ml.so.1)
#include <cstdio>
#include <exception>

#include "mig/catalog.h"
#include "mig/nvml_catalog.h"
#include "mig/planner.h"
#include "node/mig_gpu.h"
#include "node/nvml.h"

using namespace tessera;

int main(int argc, char** argv) {
  try {
    node::Nvml nvml(argc > 1 ? argv[1] : "libnvidia-ml.so.1");
    const node::Inventory inventory = node::read_inventory(nvml);
    std::printf("driver=%s\ncuda=%d.%d\n", inventory.driver_version.c_str(), inventory.cuda_major,
                inventory.cuda_minor);
    for (const node::GpuInfo& gpu : inventory.gpus) {
      std::printf(
          "gpu=%u uuid=%s name=\"%s\" bus=%s memory_mib=%llu cc=%d.%d numa=%d "
          "mig_capable=%d mig_enabled=%d\n",
          gpu.index, gpu.uuid.c_str(), gpu.name.c_str(), gpu.pci_bus_id.c_str(),
          static_cast<unsigned long long>(gpu.memory_bytes >> 20), gpu.cc_major, gpu.cc_minor,
          gpu.numa_node, gpu.mig_capable, gpu.mig_enabled);
    }
    try {
      node::EventSet events(nvml, inventory,
                            abi::nvmlEventTypeXidCriticalError |
                                abi::nvmlEventTypeDoubleBitEccError |
                                abi::nvmlEventTypeSingleBitEccError);
      std::printf("events=%zu of %zu GPUs watched\n",
                  inventory.gpus.size() - events.unwatched().size(), inventory.gpus.size());
      for (const auto& [gpu, why] : events.unwatched()) {
        std::printf("unwatched=%d %s\n", gpu, why.c_str());
      }
    } catch (const std::exception& error) {
      std::printf("events=none (%s)\n", error.what());
    }
    if (inventory.gpus.empty()) return 0;

    // The MIG catalog of GPU 0, read through the same calls the node agent uses.
    abi::nvmlDevice_t device = nullptr;
    nvml.nvmlDeviceGetHandleByIndex_v2(0, &device);
    const mig::NvmlCatalog reported =
        mig::read_nvml_catalog({nvml.nvmlDeviceGetGpuInstanceProfileInfoV,
                                nvml.nvmlDeviceGetGpuInstancePossiblePlacements_v2},
                               device, inventory.gpus[0].name,
                               [&](abi::nvmlReturn_t status) { return nvml.error_text(status); });
    for (const std::string& note : reported.notes) std::printf("mig_note=%s\n", note.c_str());
    std::printf(
        "\n| MIG profile (NVML) | ID | compute slices | placements {start}:size | most | "
        "memory MiB | SMs |\n|---|---|---|---|---|---|---|\n");
    for (const mig::Profile& profile : reported.model.profiles) {
      std::string starts;
      for (const int start : profile.starts)
        starts += (starts.empty() ? "" : ",") + std::to_string(start);
      std::printf("| %s | %u | %d | {%s}:%d | %d | %llu | %d |\n", profile.name.c_str(), profile.id,
                  profile.compute_slices, starts.c_str(), profile.memory_slices, profile.most,
                  static_cast<unsigned long long>(profile.memory_mib), profile.sm_count);
    }
    const mig::GpuModel* builtin = mig::find_model(inventory.gpus[0].name);
    if (builtin == nullptr) {
      std::printf("\nmig_catalog=no built-in model for \"%s\"\n", inventory.gpus[0].name.c_str());
    } else if (reported.model.profiles.empty()) {
      std::printf("\nmig_catalog=NVML reported no profiles to compare with %s\n",
                  builtin->key.c_str());
    } else {
      const auto differences = mig::catalog_differences(*builtin, reported.model);
      std::printf("\nmig_catalog=%s: %zu difference(s) from the built-in catalog\n",
                  builtin->key.c_str(), differences.size());
      for (const std::string& difference : differences) std::printf("  %s\n", difference.c_str());
    }
    // tessera mig's view of GPU 0 (read-only: nothing is created or changed), and where the
    // planner would put 3g + 2g + 2g on the catalog NVML reported.
    if (inventory.gpus[0].mig_capable) {
      const node::MigGpu state = node::read_mig_gpu(nvml, inventory.gpus[0]);
      std::printf("mig_mode=%s pending=%s pci_device_id=0x%08X processes=%zu\n",
                  state.enabled ? "on" : "off", state.pending_enabled ? "on" : "off",
                  state.pci_device_id, state.processes.size());
      mig::ProfileCounts wanted;
      for (const mig::Profile& profile : state.model->profiles) {
        if (profile.compute_slices == 3) wanted[profile.name] = 1;
        if (profile.compute_slices == 2) wanted[profile.name] = 2;
      }
      const mig::Plan plan = mig::place(*state.model, wanted);
      std::printf("mig_plan=%s\n  %s\n", plan.found ? "found" : plan.why.c_str(),
                  mig::picture(*state.model, plan.layout).c_str());
    }
  } catch (const std::exception& error) {
    std::printf("error=%s\n", error.what());
    return 1;
  }
  return 0;
}
