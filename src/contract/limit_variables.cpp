#include "contract/limit_variables.h"

#include <fmt/core.h>

#include <stdexcept>

#include "common/limits.h"
#include "contract/variables.h"

namespace tessera::contract {
namespace {

std::string list_of(const std::vector<std::uint64_t>& values) {
  char text[16 * 32];
  if (values.size() > static_cast<std::size_t>(kMostDevices) ||
      !format_limit_list(values.data(), static_cast<int>(values.size()), text, sizeof text)) {
    throw std::invalid_argument(fmt::format("limits for {} devices", values.size()));
  }
  return text;
}

}  // namespace

std::map<std::string, std::string> limit_variables(const std::vector<std::uint64_t>& memory_bytes,
                                                   const std::vector<int>& core_percent) {
  std::map<std::string, std::string> variables;
  std::vector<std::uint64_t> cores;
  for (const int percent : core_percent)
    cores.push_back(percent > 0 ? static_cast<std::uint64_t>(percent) : 0);
  if (const std::string memory = list_of(memory_bytes); !memory.empty()) {
    variables[kMemoryLimitVariable] = memory;
  }
  if (const std::string shares = list_of(cores); !shares.empty()) {
    variables[kCoreLimitVariable] = shares;
  }
  for (std::size_t device = 0; device < memory_bytes.size(); ++device) {
    if (memory_bytes[device] != 0) {  // HAMi's form: MiB with its unit
      variables[fmt::format("{}_{}", kHamiMemoryLimitVariable, device)] =
          fmt::format("{}m", memory_bytes[device] >> 20);
    }
  }
  for (std::size_t device = 0; device < cores.size(); ++device) {
    if (cores[device] != 0) {
      variables[fmt::format("{}_{}", kHamiCoreLimitVariable, device)] =
          std::to_string(cores[device]);
    }
  }
  return variables;
}

}  // namespace tessera::contract
