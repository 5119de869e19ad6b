// snprintf into a fixed buffer that says when the text did not fit, for paths and names
// built from outside input: a truncated path names a different file, so it is an error.
// libc-only, usable in the hook and the simulated driver.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdio>

#include "common/error_text.h"

namespace tessera {

// Formats into out; false, with `error` saying what did not fit, if the text is longer.
[[gnu::format(printf, 4, 5)]] inline bool format_bounded(char* out, std::size_t size,
                                                         ErrorText& error, const char* format,
                                                         ...) {
  va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(out, size, format, args);
  va_end(args);
  if (length < 0 || static_cast<std::size_t>(length) >= size) {
    return error.set("'%.200s...' is longer than %zu characters", out, size - 1);
  }
  return true;
}

}  // namespace tessera
