// tessera devices: the GPUs this machine has, as NVML reports them.
#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/environment.h"
#include "cli/gpus.h"

namespace tessera::cli {

int devices_command(const DevicesOptions& options) {
  const Installation installation = locate_installation();
  const bool simulated = use_simulated_gpu(installation);
  const std::vector<GpuInfo> gpus = list_gpus(installation, simulated);
  if (options.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const GpuInfo& gpu : gpus) {
      list.push_back({{"index", gpu.index},
                      {"name", gpu.name},
                      {"uuid", gpu.uuid},
                      {"memory_total", gpu.memory_total},
                      {"memory_used", gpu.memory_used},
                      {"simulated", simulated}});
    }
    fmt::print("{}\n", list.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  fmt::print("{} GPU(s), {}\n", gpus.size(),
             simulated ? "simulated (no NVIDIA driver found)" : "NVIDIA driver");
  fmt::print("{:<6}{:<28}{:<44}{:>14}{:>14}\n", "INDEX", "NAME", "UUID", "MEMORY", "USED");
  for (const GpuInfo& gpu : gpus) {
    fmt::print("{:<6}{:<28}{:<44}{:>14}{:>14}\n", gpu.index, gpu.name, gpu.uuid,
               human_size(gpu.memory_total), human_size(gpu.memory_used));
  }
  return 0;
}

}  // namespace tessera::cli
