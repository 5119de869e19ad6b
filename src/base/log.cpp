#include "base/log.h"

#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "base/mutex.h"
#include "contract/variables.h"

namespace tessera::base {
namespace {

Mutex stderr_mutex;  // one writer of a line at a time: a program's threads log concurrently

void to_stderr(std::string_view line) {
  MutexLock locked(stderr_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

ProgramLog::ProgramLog(std::string program, const char* level_setting, Sink sink)
    : program_(std::move(program)), sink_(sink ? std::move(sink) : Sink(to_stderr)) {
  if (level_setting != nullptr && !parse_log_level(level_setting, level_)) {
    level_ = LogLevel::info;
    write(LogLevel::warn,
          // Quoted and escaped: a value from outside must not start lines of its own.
          fmt::format("{}={:?} is none of off, error, warn, info, debug; logging at info",
                      contract::kLogLevelVariable, std::string_view(level_setting).substr(0, 64)));
  }
}

ProgramLog::ProgramLog(std::string program)
    : ProgramLog(std::move(program), std::getenv(contract::kLogLevelVariable)) {}

void ProgramLog::write(LogLevel level, std::string_view message) const {
  if (level == LogLevel::off || static_cast<int>(level) > static_cast<int>(level_)) return;
  try {
    sink_(fmt::format("tessera {}[{}] {}: {}\n", program_, static_cast<int>(getpid()),
                      log_level_name(level), message));
  } catch (...) {  // a line that cannot be written is lost, not the program
  }
}

void tell(const Reporter& report, const std::string& message) noexcept {
  if (!report) return;
  try {
    report(message);
  } catch (...) {
  }
}

Reporter ProgramLog::reporter(LogLevel level) const {
  return [this, level](const std::string& message) { write(level, message); };
}

}  // namespace tessera::base
