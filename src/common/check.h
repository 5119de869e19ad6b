// Invariant checks: TESSERA_DCHECK(condition) aborts with the condition, file and line when an
// invariant the code relies on does not hold. On in debug and sanitizer builds (CMake defines
// TESSERA_DCHECKS there); elsewhere the condition is not evaluated. Guest-safe (no C++
// runtime) and header-only, so the hook, the simulated driver and host code all use it.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace tessera {

[[noreturn]] inline void dcheck_failed(const char* condition, const char* file, int line) {
  char text[512];
  const int length = std::snprintf(text, sizeof text, "tessera: invariant broken at %s:%d: %s\n",
                                   file, line, condition);
  if (length > 0) {
    const auto wanted = static_cast<std::size_t>(length);
    (void)!write(STDERR_FILENO, text, wanted < sizeof text ? wanted : sizeof text - 1);
  }
  std::abort();
}

}  // namespace tessera

#if defined(TESSERA_DCHECKS)
#define TESSERA_DCHECK(condition) \
  ((condition) ? static_cast<void>(0) : ::tessera::dcheck_failed(#condition, __FILE__, __LINE__))
#else
#define TESSERA_DCHECK(condition) static_cast<void>(sizeof(static_cast<bool>(condition)))
#endif
