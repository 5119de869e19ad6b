#include "simgpu/sim_mps.h"

#include <cctype>
#include <cstdlib>

namespace tessera::sim {

bool parse_mps_memory(const char* text, std::uint64_t& bytes) {
  if (text == nullptr || !std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  unsigned shift = 0;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case '\0':
      break;
    case 'K':
      shift = 10;
      break;
    case 'M':
      shift = 20;
      break;
    case 'G':
      shift = 30;
      break;
    case 'T':
      shift = 40;
      break;
    default:
      return false;
  }
  if (shift != 0 && end[1] != '\0') return false;
  constexpr unsigned long long kMost = 1ull << 50;
  if (value > (kMost >> shift)) return false;
  bytes = value << shift;
  return true;
}

}  // namespace tessera::sim
