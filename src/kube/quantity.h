// Kubernetes resource quantities (k8s.io/apimachinery resource.Quantity), as pods and nodes
// write them.
#pragma once

#include <cstdint>
#include <string_view>

namespace tessera::kube {

// Kubernetes quantities, read exactly: "2", "500m", "1.5", "2e3" (CPU, to milli-CPU, rounded
// up); "1Gi", "512Mi", "1G", "1000" (memory, to MiB, rounded up); whole counts for GPU
// resources. False on anything else, and on values past these bounds (no resource of a real
// node comes near them; they keep every sum far from overflow).
inline constexpr std::int64_t kMostCpuMilli = std::int64_t{1} << 40;   // a billion CPUs
inline constexpr std::int64_t kMostMemoryMib = std::int64_t{1} << 40;  // an exbibyte
inline constexpr std::int64_t kMostCount = 1 << 20;
bool parse_cpu_milli(std::string_view text, std::int64_t& milli);
bool parse_memory_mib(std::string_view text, std::int64_t& mib);
bool parse_count(std::string_view text, std::int64_t& count);

}  // namespace tessera::kube
