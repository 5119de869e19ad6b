// Logging for Tessera's own programs (tessera node, tessera scheduler): one whole line per
// message on stderr, "tessera <program>[<pid>] <level>: <message>", as the hook writes its
// lines (common/log.h). TESSERA_LOG_LEVEL (contract/variables.h) sets how much, with the
// hook's names (off, error, warn, info, debug); a program's default is info where the hook's
// is error, and a value that is no level is said once and info kept.
//
// The parts of Tessera do not write logs: they take a Reporter and say what happened through
// it, so that a test hears it and a program writes it here.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "common/log.h"

namespace tessera::base {

// How a part says what happened: one message, no line break.
using Reporter = std::function<void(const std::string&)>;
// Says `message` through `report`, if there is one. A report that cannot be made (it threw)
// is dropped: it must not take the request or thread that made it with it.
void tell(const Reporter& report, const std::string& message) noexcept;

class ProgramLog {
 public:
  // Where whole lines go; stderr unless a test gives its own.
  using Sink = std::function<void(std::string_view line)>;
  // `level_setting`: TESSERA_LOG_LEVEL's value, or null when unset.
  ProgramLog(std::string program, const char* level_setting, Sink sink = {});
  // From the process's environment.
  explicit ProgramLog(std::string program);

  LogLevel level() const { return level_; }
  // Never throws: a closed or full stderr must not take the program down.
  void write(LogLevel level, std::string_view message) const;
  void error(std::string_view message) const { write(LogLevel::error, message); }
  void warning(std::string_view message) const { write(LogLevel::warn, message); }
  void info(std::string_view message) const { write(LogLevel::info, message); }
  // What a part reports, written at `level`. Holds this log by reference.
  Reporter reporter(LogLevel level = LogLevel::info) const;

 private:
  std::string program_;
  LogLevel level_ = LogLevel::info;
  Sink sink_;
};

}  // namespace tessera::base
