// A fixed-size error message, usable where neither exceptions nor std::string may be
// (the hook and the simulated driver run inside other people's processes).
#pragma once

#include <cstdarg>
#include <cstdio>

namespace tessera {

struct ErrorText {
  char text[512] = {};

  [[gnu::format(printf, 2, 3)]] bool set(const char* format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(text, sizeof text, format, args);
    va_end(args);
    return false;  // lets callers write `return error.set(...)` in bool functions
  }
  bool empty() const { return text[0] == '\0'; }
};

}  // namespace tessera
