// What the latency benchmarks share: durations in microseconds and their percentiles.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace tessera::bench {

inline double micros(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration<double, std::micro>(duration).count();
}

// The value below which `fraction` of `values` lie (0.5: the median).
inline double percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1,
                         static_cast<std::size_t>(fraction * static_cast<double>(values.size())))];
}

}  // namespace tessera::bench
