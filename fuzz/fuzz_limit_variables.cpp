// The variables a workload's environment sets its limits with (contract/variables.h: Tessera's
// and HAMi's memory and core limits, per device or for all, and priorities): any values are
// read or refused with a message, what is read is in range, and what the one formatter writes
// of it reads back the same. The input is the variables' values, separated by NUL bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/limits.h"
#include "common/priority.h"
#include "contract/variables.h"
#include "fuzz_input.h"

using namespace tessera;
using tessera::fuzz::broken;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string kVariables[] = {contract::kMemoryLimitVariable,
                                           contract::kHamiMemoryLimitVariable,
                                           std::string(contract::kHamiMemoryLimitVariable) + "_0",
                                           std::string(contract::kHamiMemoryLimitVariable) + "_15",
                                           contract::kCoreLimitVariable,
                                           contract::kHamiCoreLimitVariable,
                                           std::string(contract::kHamiCoreLimitVariable) + "_3",
                                           contract::kPriorityVariable,
                                           contract::kHamiPriorityVariable};
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::size_t start = 0;
  for (const std::string& name : kVariables) {
    const char* variable = name.c_str();
    if (start > input.size()) {
      unsetenv(variable);
      continue;
    }
    const std::size_t end = std::min(input.find('\0', start), input.size());
    setenv(variable, input.substr(start, end - start).c_str(), 1);
    start = end + 1;
  }
  DeviceLimits limits;
  ErrorText error;
  if (memory_limits_from_environment(limits, error)) {
    // The one writer of the list form, read back by the one reader.
    char text[1024];
    if (!format_limit_list(limits.memory_bytes, kMostDevices, text, sizeof text)) {
      broken("limits that were read cannot be written");
    }
    DeviceLimits again;
    if (text[0] != '\0' && !parse_memory_limit_list("again", text, again, error)) {
      broken("what the formatter wrote is refused by the parser");
    }
    for (int device = 0; device < kMostDevices; ++device) {
      if (again.memory_bytes[device] != limits.memory_bytes[device]) {
        broken("what the formatter wrote reads back otherwise");
      }
    }
  } else if (error.empty()) {
    broken("memory limits refused without a message");
  }
  if (core_limits_from_environment(limits, error)) {
    for (const std::uint32_t percent : limits.core_percent) {
      if (percent > 100) broken("a core share above 100 % was read");
    }
  } else if (error.empty()) {
    broken("core limits refused without a message");
  }
  Priority priority = Priority::none;
  if (!priority_from_environment(priority, error) && error.empty()) {
    broken("a priority refused without a message");
  }
  return 0;
}
