#include "common/units.h"

#include <cstdio>

#include "common/text.h"

namespace tessera {
namespace {

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

struct Suffix {
  std::string_view name;
  std::uint64_t multiplier;
};

constexpr std::uint64_t kKi = 1024;
constexpr Suffix kSuffixes[] = {
    {"", 1},
    {"b", 1},
    {"k", kKi},
    {"kib", kKi},
    {"kb", 1000},
    {"m", kKi* kKi},
    {"mib", kKi* kKi},
    {"mb", 1000 * 1000},
    {"g", kKi* kKi* kKi},
    {"gib", kKi* kKi* kKi},
    {"gb", 1000ull * 1000 * 1000},
    {"t", kKi* kKi* kKi* kKi},
    {"tib", kKi* kKi* kKi* kKi},
    {"tb", 1000ull * 1000 * 1000 * 1000},
};

}  // namespace

bool parse_size(std::string_view text, std::uint64_t& bytes) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  std::size_t digits = 0;
  std::uint64_t whole = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
    const std::uint64_t digit = static_cast<std::uint64_t>(text[digits] - '0');
    if (whole > (UINT64_MAX - digit) / 10) return false;
    whole = whole * 10 + digit;
    ++digits;
  }
  if (digits == 0) return false;
  // An optional fraction, so "1.5GiB" works; it is applied to the multiplier below.
  std::uint64_t fraction = 0, fraction_scale = 1;
  std::size_t position = digits;
  if (position < text.size() && text[position] == '.') {
    ++position;
    const std::size_t fraction_start = position;
    while (position < text.size() && text[position] >= '0' && text[position] <= '9') {
      if (fraction_scale < 1000000000ull) {
        fraction = fraction * 10 + static_cast<std::uint64_t>(text[position] - '0');
        fraction_scale *= 10;
      }
      ++position;
    }
    if (position == fraction_start) return false;
  }
  std::string_view suffix = slice(text, position);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  for (const Suffix& candidate : kSuffixes) {
    if (!equals_ignoring_case(suffix, candidate.name)) continue;
    const std::uint64_t multiplier = candidate.multiplier;
    if (whole != 0 && multiplier > UINT64_MAX / whole) return false;
    const std::uint64_t fractional_bytes = static_cast<std::uint64_t>(
        static_cast<long double>(multiplier) * fraction / fraction_scale);
    if (fraction != 0 && multiplier == 1) return false;  // no fractional bytes
    if (whole * multiplier > UINT64_MAX - fractional_bytes) return false;
    bytes = whole * multiplier + fractional_bytes;
    return true;
  }
  return false;
}

void format_size(std::uint64_t bytes, char* out, std::size_t out_size) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) {
    std::snprintf(out, out_size, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(out, out_size, "%.2f %s", value, kUnits[unit]);
  }
}

}  // namespace tessera
