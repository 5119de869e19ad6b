#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "contract/variables.h"

namespace tessera {
namespace {

std::atomic<int> cached_level{-1};

}  // namespace

bool parse_log_level(const char* value, LogLevel& level) {
  if (value == nullptr) return false;
  static constexpr struct {
    const char* name;
    LogLevel level;
  } kLevels[] = {{"off", LogLevel::off},
                 {"error", LogLevel::error},
                 {"warn", LogLevel::warn},
                 {"info", LogLevel::info},
                 {"debug", LogLevel::debug}};
  for (const auto& entry : kLevels) {
    if (std::strcmp(value, entry.name) == 0) {
      level = entry.level;
      return true;
    }
  }
  return false;
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warning";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
    case LogLevel::off:
      break;
  }
  return "";
}

LogLevel log_level() {
  int level = cached_level.load(std::memory_order_relaxed);
  if (level < 0) {
    LogLevel chosen = LogLevel::error;  // unset or unknown: only what disables CUDA
    parse_log_level(std::getenv(contract::kLogLevelVariable), chosen);
    level = static_cast<int>(chosen);
    cached_level.store(level, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(level);
}

void log(LogLevel level, const char* component, const char* format, ...) {
  if (level == LogLevel::off || static_cast<int>(level) > static_cast<int>(log_level())) return;
  char line[1024];
  int length = std::snprintf(line, sizeof line, "tessera %s[%d] %s: ", component,
                             static_cast<int>(getpid()), log_level_name(level));
  if (length < 0) return;
  va_list args;
  va_start(args, format);
  const int body = std::vsnprintf(line + length, sizeof line - static_cast<std::size_t>(length) - 1,
                                  format, args);
  va_end(args);
  if (body > 0) length += body;
  if (length > static_cast<int>(sizeof line) - 2) length = static_cast<int>(sizeof line) - 2;
  line[length++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, static_cast<std::size_t>(length));
  (void)ignored;
}

}  // namespace tessera
