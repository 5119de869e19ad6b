#include "common/limits.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/text.h"
#include "common/units.h"

namespace tessera {

void DeviceLimits::tighten(int device, std::uint64_t bytes) {
  if (bytes == kUnlimited) return;
  std::uint64_t& current = memory_bytes[device];
  if (current == kUnlimited || bytes < current) current = bytes;
}

void DeviceLimits::tighten_cores(int device, std::uint32_t percent) {
  std::uint32_t& current = core_percent[device];
  if (percent != 0 && (current == 0 || percent < current)) current = percent;
}

bool DeviceLimits::any_cores() const {
  for (std::uint32_t percent : core_percent) {
    if (percent != 0) return true;
  }
  return false;
}

bool DeviceLimits::any() const {
  for (std::uint64_t bytes : memory_bytes) {
    if (bytes != kUnlimited) return true;
  }
  return false;
}

namespace {

bool parse_device_index(std::string_view text, int& device) {
  if (text.empty() || text.size() > 2) return false;
  device = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    device = device * 10 + (c - '0');
  }
  return device < kMaxDevices;
}

bool parse_positive_size(const char* variable, const char* value, std::string_view text,
                         std::uint64_t& bytes, ErrorText& error) {
  if (!parse_size(text, bytes)) {
    return error.set("%s='%s': '%.*s' is not a size (write e.g. 8GiB, 512MiB, 8g or 8589934592)",
                     variable, value, static_cast<int>(text.size()), text.data());
  }
  if (bytes == 0) {
    return error.set("%s='%s': a memory limit must be larger than 0", variable, value);
  }
  return true;
}

}  // namespace

bool parse_memory_limit_list(const char* variable, const char* value, DeviceLimits& limits,
                             ErrorText& error) {
  std::string_view rest(value);
  if (rest.find('=') == std::string_view::npos) {
    std::uint64_t bytes = 0;
    if (!parse_positive_size(variable, value, rest, bytes, error)) return false;
    for (int device = 0; device < kMaxDevices; ++device) limits.tighten(device, bytes);
    return true;
  }
  for (bool more = true; more;) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = slice(rest, 0, comma);
    more = comma != std::string_view::npos;  // "0=1G," ends in an empty item: an error
    rest = slice(rest, comma == std::string_view::npos ? rest.size() : comma + 1);
    const std::size_t equals = item.find('=');
    int device = 0;
    if (equals == std::string_view::npos || !parse_device_index(slice(item, 0, equals), device)) {
      return error.set("%s='%s': '%.*s' is not DEVICE=SIZE with DEVICE from 0 to %d", variable,
                       value, static_cast<int>(item.size()), item.data(), kMaxDevices - 1);
    }
    std::uint64_t bytes = 0;
    if (!parse_positive_size(variable, value, slice(item, equals + 1), bytes, error)) return false;
    limits.tighten(device, bytes);
  }
  return true;
}

bool memory_limits_from_environment(DeviceLimits& limits, ErrorText& error) {
  for (const char* variable : {"TESSERA_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && !parse_memory_limit_list(variable, value, limits, error)) return false;
  }
  for (int device = 0; device < kMaxDevices; ++device) {
    char variable[48];
    std::snprintf(variable, sizeof variable, "CUDA_DEVICE_MEMORY_LIMIT_%d", device);
    const char* value = std::getenv(variable);
    if (value == nullptr) continue;
    std::uint64_t bytes = 0;
    if (!parse_positive_size(variable, value, value, bytes, error)) return false;
    limits.tighten(device, bytes);
  }
  return true;
}

}  // namespace tessera

namespace tessera {
namespace {

bool parse_percent(const char* variable, const char* value, std::string_view text,
                   std::uint32_t& percent, ErrorText& error) {
  std::uint32_t number = 0;
  bool digits = !text.empty() && text.size() <= 3;
  for (char c : text) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) number = number * 10 + static_cast<std::uint32_t>(c - '0');
  }
  if (!digits || number < 1 || number > 100) {
    return error.set("%s='%s': '%.*s' is not a percentage from 1 to 100", variable, value,
                     static_cast<int>(text.size()), text.data());
  }
  percent = number;
  return true;
}

bool parse_core_list(const char* variable, const char* value, DeviceLimits& limits,
                     ErrorText& error) {
  std::string_view rest(value);
  if (rest.find('=') == std::string_view::npos) {
    std::uint32_t percent = 0;
    if (!parse_percent(variable, value, rest, percent, error)) return false;
    for (int device = 0; device < kMaxDevices; ++device) limits.tighten_cores(device, percent);
    return true;
  }
  for (bool more = true; more;) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = slice(rest, 0, comma);
    more = comma != std::string_view::npos;
    rest = slice(rest, comma == std::string_view::npos ? rest.size() : comma + 1);
    const std::size_t equals = item.find('=');
    int device = 0;
    if (equals == std::string_view::npos || !parse_device_index(slice(item, 0, equals), device)) {
      return error.set("%s='%s': '%.*s' is not DEVICE=PERCENT with DEVICE from 0 to %d", variable,
                       value, static_cast<int>(item.size()), item.data(), kMaxDevices - 1);
    }
    std::uint32_t percent = 0;
    if (!parse_percent(variable, value, slice(item, equals + 1), percent, error)) return false;
    limits.tighten_cores(device, percent);
  }
  return true;
}

}  // namespace

bool core_limits_from_environment(DeviceLimits& limits, ErrorText& error) {
  for (const char* variable : {"TESSERA_CORE_LIMIT", "CUDA_DEVICE_SM_LIMIT"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && !parse_core_list(variable, value, limits, error)) return false;
  }
  for (int device = 0; device < kMaxDevices; ++device) {
    char variable[48];
    std::snprintf(variable, sizeof variable, "CUDA_DEVICE_SM_LIMIT_%d", device);
    const char* value = std::getenv(variable);
    if (value == nullptr) continue;
    std::uint32_t percent = 0;
    if (!parse_percent(variable, value, value, percent, error)) return false;
    limits.tighten_cores(device, percent);
  }
  return true;
}

}  // namespace tessera
