#include "common/limits.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/text.h"
#include "common/units.h"
#include "contract/variables.h"

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
  return device < kMostDevices;
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

// A limit of one kind: its name in errors, how to read one value, how to apply it.
struct LimitKind {
  const char* value_name;  // "SIZE", "PERCENT"
  bool (*parse)(const char* variable, const char* value, std::string_view text,
                std::uint64_t& parsed, ErrorText& error);
  void (*apply)(DeviceLimits& limits, int device, std::uint64_t parsed);
};

bool parse_size_value(const char* variable, const char* value, std::string_view text,
                      std::uint64_t& parsed, ErrorText& error) {
  return parse_positive_size(variable, value, text, parsed, error);
}
bool parse_percent_value(const char* variable, const char* value, std::string_view text,
                         std::uint64_t& parsed, ErrorText& error) {
  std::uint32_t percent = 0;
  if (!parse_percent(variable, value, text, percent, error)) return false;
  parsed = percent;
  return true;
}

constexpr LimitKind kMemory{
    "SIZE", parse_size_value,
    [](DeviceLimits& limits, int device, std::uint64_t bytes) { limits.tighten(device, bytes); }};
constexpr LimitKind kCores{"PERCENT", parse_percent_value,
                           [](DeviceLimits& limits, int device, std::uint64_t percent) {
                             limits.tighten_cores(device, static_cast<std::uint32_t>(percent));
                           }};

// "V" for every device, or "0=V,1=V" for some.
bool parse_device_list(const LimitKind& kind, const char* variable, const char* value,
                       DeviceLimits& limits, ErrorText& error) {
  std::string_view rest(value);
  std::uint64_t parsed = 0;
  if (rest.find('=') == std::string_view::npos) {
    if (!kind.parse(variable, value, rest, parsed, error)) return false;
    for (int device = 0; device < kMostDevices; ++device) kind.apply(limits, device, parsed);
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
      return error.set("%s='%s': '%.*s' is not DEVICE=%s with DEVICE from 0 to %d", variable, value,
                       static_cast<int>(item.size()), item.data(), kind.value_name,
                       kMostDevices - 1);
    }
    if (!kind.parse(variable, value, slice(item, equals + 1), parsed, error)) return false;
    kind.apply(limits, device, parsed);
  }
  return true;
}

// The lists in `lists` (Tessera's and HAMi's), then HAMi's per-device `<per_device>_<i>`.
bool limits_from_environment(const LimitKind& kind, const char* const (&lists)[2],
                             const char* per_device, DeviceLimits& limits, ErrorText& error) {
  for (const char* variable : lists) {
    const char* value = std::getenv(variable);
    if (value != nullptr && !parse_device_list(kind, variable, value, limits, error)) return false;
  }
  for (int device = 0; device < kMostDevices; ++device) {
    char variable[48];
    std::snprintf(variable, sizeof variable, "%s_%d", per_device, device);
    const char* value = std::getenv(variable);
    if (value == nullptr) continue;
    std::uint64_t parsed = 0;
    if (!kind.parse(variable, value, value, parsed, error)) return false;
    kind.apply(limits, device, parsed);
  }
  return true;
}

}  // namespace

bool parse_memory_limit_list(const char* variable, const char* value, DeviceLimits& limits,
                             ErrorText& error) {
  return parse_device_list(kMemory, variable, value, limits, error);
}

bool memory_limits_from_environment(DeviceLimits& limits, ErrorText& error) {
  static constexpr const char* kLists[2] = {contract::kMemoryLimitVariable,
                                            contract::kHamiMemoryLimitVariable};
  return limits_from_environment(kMemory, kLists, contract::kHamiMemoryLimitVariable, limits,
                                 error);
}

bool core_limits_from_environment(DeviceLimits& limits, ErrorText& error) {
  static constexpr const char* kLists[2] = {contract::kCoreLimitVariable,
                                            contract::kHamiCoreLimitVariable};
  return limits_from_environment(kCores, kLists, contract::kHamiCoreLimitVariable, limits, error);
}

bool format_limit_list(const std::uint64_t* values, int count, char* out, std::size_t size) {
  if (size == 0) return false;
  out[0] = '\0';
  bool every = count == kMostDevices && values[0] != 0;
  for (int device = 1; every && device < count; ++device) every = values[device] == values[0];
  if (every) {  // the same for every device: the short form
    const int written =
        std::snprintf(out, size, "%llu", static_cast<unsigned long long>(values[0]));
    return written >= 0 && static_cast<std::size_t>(written) < size;
  }
  std::size_t used = 0;
  for (int device = 0; device < count && device < kMostDevices; ++device) {
    if (values[device] == 0) continue;
    const int written = std::snprintf(out + used, size - used, "%s%d=%llu", used == 0 ? "" : ",",
                                      device, static_cast<unsigned long long>(values[device]));
    if (written < 0 || static_cast<std::size_t>(written) >= size - used) return false;
    used += static_cast<std::size_t>(written);
  }
  return true;
}

}  // namespace tessera
