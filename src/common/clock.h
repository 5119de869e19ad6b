// CLOCK_MONOTONIC in nanoseconds: the one clock the hook's pacing, the ledger's group clocks,
// the simulated device's timeline and the tests all compare. Header-only and libc-only, so
// the hook and the simulated driver can use it.
#pragma once

#include <time.h>

#include <cerrno>
#include <cstdint>

namespace tessera {

inline std::uint64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::uint64_t>(now.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(now.tv_nsec);
}

// Sleeps until monotonic_ns() reaches when_ns (at once if it has), through signals.
inline void sleep_until_ns(std::uint64_t when_ns) {
  const timespec until{static_cast<time_t>(when_ns / 1000000000ull),
                       static_cast<long>(when_ns % 1000000000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nullptr) == EINTR) {
  }
}

}  // namespace tessera
