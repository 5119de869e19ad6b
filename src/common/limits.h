// Per-device limits as the hook reads them from its environment.
//
// Memory: TESSERA_MEMORY_LIMIT ("8GiB" for every device, or "0=8GiB,1=4GiB"), and HAMi's
// CUDA_DEVICE_MEMORY_LIMIT / CUDA_DEVICE_MEMORY_LIMIT_<i>. Where several name a device,
// the tightest wins: a second source can only lower a limit, never raise it. The variables'
// names are contract/variables.h's; the one writer of the list form is format_limit_list.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/error_text.h"

namespace tessera {

inline constexpr int kMostDevices = 16;
inline constexpr std::uint64_t kUnlimited = 0;  // a limit of 0 means "none"

struct DeviceLimits {
  std::uint64_t memory_bytes[kMostDevices] = {};  // kUnlimited where none applies
  std::uint32_t core_percent[kMostDevices] = {};  // 0 where no compute share applies

  // Lowers device's limit to bytes (a bytes of kUnlimited changes nothing).
  void tighten(int device, std::uint64_t bytes);
  void tighten_cores(int device, std::uint32_t percent);
  bool any() const;
  bool any_cores() const;
};

// Reads one variable's value into limits. `variable` is only used for messages. A value
// like "8GiB" applies to all devices; "0=8GiB,1=4GiB" to the listed ones.
bool parse_memory_limit_list(const char* variable, const char* value, DeviceLimits& limits,
                             ErrorText& error);

// Reads every supported variable from getenv; false with a message naming the variable
// and its value if any is malformed.
bool memory_limits_from_environment(DeviceLimits& limits, ErrorText& error);

// Compute shares: TESSERA_CORE_LIMIT ("30" for every device, or "0=30,1=50") and HAMi's
// CUDA_DEVICE_SM_LIMIT / CUDA_DEVICE_SM_LIMIT_<i>, percent of a device's time from 1 to 100.
bool core_limits_from_environment(DeviceLimits& limits, ErrorText& error);

// The form the readers above take: "0=V,1=V" for the first `count` values that are not 0
// (none), "" if all are, and "V" when all kMostDevices are V. False if it does not fit in `size`.
bool format_limit_list(const std::uint64_t* values, int count, char* out, std::size_t size);

}  // namespace tessera
