// Kubernetes quantities as pods and nodes carry them ("500m", "1.5Gi", "2e3"): parsed exactly,
// refused when malformed or out of range, never wrapped.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_input.h"
#include "kube/quantity.h"

using namespace tessera::kube;
using tessera::fuzz::broken;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::int64_t value = -1;
  if (parse_cpu_milli(text, value) && (value < 0 || value > kMostCpuMilli)) {
    broken("a CPU quantity out of range was accepted");
  }
  value = -1;
  if (parse_memory_mib(text, value) && (value < 0 || value > kMostMemoryMib)) {
    broken("a memory quantity out of range was accepted");
  }
  value = -1;
  if (parse_count(text, value) && (value < 0 || value > kMostCount)) {
    broken("a count out of range was accepted");
  }
  return 0;
}
