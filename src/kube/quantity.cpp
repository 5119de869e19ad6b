#include "kube/quantity.h"

#include <charconv>
#include <utility>

namespace tessera::kube {
namespace {

// A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): an unsigned decimal number
// with a binary suffix (Ki .. Ei), a decimal one (n u m "" k M G T P E) or an exponent
// (e3, E-2), read exactly: the value is digits / 10^fraction * 10^power * 2^binary.
// Wide enough for any quantity below the bounds times any suffix (__extension__: GCC and
// Clang have it; ISO C++ has no 128-bit integer).
__extension__ typedef __int128 Wide;

struct Quantity {
  Wide digits = 0;
  int fraction = 0;  // digits after the point
  int power = 0;     // decimal suffix or exponent
  int binary = 0;    // binary suffix, in powers of two
};

bool read_quantity(std::string_view text, Quantity& quantity) {
  std::size_t at = 0;
  if (at < text.size() && text[at] == '+') ++at;
  bool any_digit = false, point = false;
  int significant = 0;
  for (; at < text.size(); ++at) {
    const char c = text[at];
    if (c == '.' && !point) {
      point = true;
      continue;
    }
    if (c < '0' || c > '9') break;
    any_digit = true;
    if (quantity.digits == 0 && c == '0') {
      if (point) ++quantity.fraction;
      continue;
    }
    if (++significant > 30) return false;  // beyond any resource's range
    quantity.digits = quantity.digits * 10 + (c - '0');
    if (point) ++quantity.fraction;
  }
  if (!any_digit) return false;
  const std::string_view suffix = text.substr(at);
  static const std::pair<std::string_view, int> kBinary[] = {{"Ki", 10}, {"Mi", 20}, {"Gi", 30},
                                                             {"Ti", 40}, {"Pi", 50}, {"Ei", 60}};
  static const std::pair<std::string_view, int> kDecimal[] = {
      {"n", -9}, {"u", -6}, {"m", -3}, {"", 0},   {"k", 3},
      {"M", 6},  {"G", 9},  {"T", 12}, {"P", 15}, {"E", 18}};
  for (const auto& [name, shift] : kBinary) {
    if (suffix == name) {
      quantity.binary = shift;
      return true;
    }
  }
  for (const auto& [name, power] : kDecimal) {
    if (suffix == name) {
      quantity.power = power;
      return true;
    }
  }
  if (suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E')) {
    int exponent = 0;
    const char* first = suffix.data() + 1;
    if (*first == '+') ++first;
    const auto [end, error] = std::from_chars(first, suffix.data() + suffix.size(), exponent);
    if (error != std::errc() || end != suffix.data() + suffix.size() || exponent < -40 ||
        exponent > 40) {
      return false;
    }
    quantity.power = exponent;
    return true;
  }
  return false;
}

// value * scale / divisor, rounded up or required exact, and at most `most`.
bool quantity_in(std::string_view text, std::int64_t scale, std::int64_t divisor, bool round_up,
                 std::int64_t most, std::int64_t& out) {
  Quantity quantity;
  if (!read_quantity(text, quantity)) return false;
  constexpr Wide kLimit = static_cast<Wide>(1) << 100;
  auto times = [&](Wide& value, Wide factor) {
    if (value != 0 && factor > kLimit / value) return false;
    value *= factor;
    return true;
  };
  Wide numerator = quantity.digits, denominator = divisor;
  if (!times(numerator, scale) || !times(numerator, static_cast<Wide>(1) << quantity.binary)) {
    return false;
  }
  const int power = quantity.power - quantity.fraction;
  for (int i = 0; i < power; ++i) {
    if (!times(numerator, 10)) return false;
  }
  for (int i = 0; i > power; --i) {
    if (!times(denominator, 10)) return false;
  }
  Wide value = numerator / denominator;
  if (numerator % denominator != 0) {
    if (!round_up) return false;
    ++value;
  }
  if (value > most) return false;
  out = static_cast<std::int64_t>(value);
  return true;
}

}  // namespace

bool parse_cpu_milli(std::string_view text, std::int64_t& milli) {
  // Kubernetes rounds a CPU quantity up to whole milli-CPU.
  return quantity_in(text, 1000, 1, true, kMostCpuMilli, milli);
}

bool parse_memory_mib(std::string_view text, std::int64_t& mib) {
  return quantity_in(text, 1, 1 << 20, true, kMostMemoryMib, mib);
}

bool parse_count(std::string_view text, std::int64_t& count) {
  return quantity_in(text, 1, 1, false, kMostCount, count);
}

}  // namespace tessera::kube
