// The variables a workload's environment sets its limits with (TESSERA_MEMORY_LIMIT,
// CUDA_DEVICE_MEMORY_LIMIT[_<i>], TESSERA_CORE_LIMIT, CUDA_DEVICE_SM_LIMIT[_<i>],
// TESSERA_PRIORITY, CUDA_TASK_PRIORITY): any values are read or refused with a message, and
// what is read is in range. The input is the variables' values, separated by NUL bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/limits.h"
#include "common/priority.h"
#include "fuzz_input.h"

using namespace tessera;
using tessera::fuzz::broken;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const char* const kVariables[] = {
      "TESSERA_MEMORY_LIMIT",        "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0",
      "CUDA_DEVICE_MEMORY_LIMIT_15", "TESSERA_CORE_LIMIT",       "CUDA_DEVICE_SM_LIMIT",
      "CUDA_DEVICE_SM_LIMIT_3",      "TESSERA_PRIORITY",         "CUDA_TASK_PRIORITY"};
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::size_t start = 0;
  for (const char* variable : kVariables) {
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
  if (!memory_limits_from_environment(limits, error) && error.empty()) {
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
