// tessera devices: the GPUs this machine has, as NVML reports them (the node agent's
// inventory: NVIDIA's NVML where a driver is installed, the simulated one otherwise).
#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/environment.h"
#include "node/nvml.h"

namespace tessera::cli {

node::Inventory machine_inventory(const Installation& installation, bool simulated) {
  node::Nvml nvml(simulated ? installation.simulator_dir + "/libnvidia-ml.so.1"
                            : "libnvidia-ml.so.1");
  return node::read_inventory(nvml);
}

int devices_command(const DevicesOptions& options) {
  const Installation installation = locate_installation();
  const bool simulated = use_simulated_gpu(installation);
  const node::Inventory inventory = machine_inventory(installation, simulated);
  auto mig = [](const node::GpuInfo& gpu) {
    return gpu.mig_enabled ? "on" : gpu.mig_capable ? "off" : "-";
  };
  if (options.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const node::GpuInfo& gpu : inventory.gpus) {
      list.push_back({{"index", gpu.index},
                      {"name", gpu.name},
                      {"uuid", gpu.uuid},
                      {"memory_total", gpu.memory_bytes},
                      {"memory_used", gpu.memory_used},
                      {"compute_capability", fmt::format("{}.{}", gpu.cc_major, gpu.cc_minor)},
                      {"pci_bus_id", gpu.pci_bus_id},
                      {"numa_node", gpu.numa_node},
                      {"mig", mig(gpu)},
                      {"simulated", simulated}});
    }
    fmt::print("{}\n", list.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  fmt::print("{} GPU(s), {}, driver {}, CUDA {}.{}\n", inventory.gpus.size(),
             simulated ? "simulated (no NVIDIA driver found)" : "NVIDIA driver",
             inventory.driver_version, inventory.cuda_major, inventory.cuda_minor);
  fmt::print("{:<6}{:<28}{:<44}{:>12}{:>12}{:>5}{:>18}{:>5}{:>5}\n", "INDEX", "NAME", "UUID",
             "MEMORY", "USED", "CC", "PCI", "NUMA", "MIG");
  for (const node::GpuInfo& gpu : inventory.gpus) {
    fmt::print("{:<6}{:<28}{:<44}{:>12}{:>12}{:>5}{:>18}{:>5}{:>5}\n", gpu.index, gpu.name,
               gpu.uuid, human_size(gpu.memory_bytes), human_size(gpu.memory_used),
               fmt::format("{}.{}", gpu.cc_major, gpu.cc_minor), gpu.pci_bus_id,
               gpu.numa_node < 0 ? std::string("-") : std::to_string(gpu.numa_node), mig(gpu));
  }
  return 0;
}

}  // namespace tessera::cli
