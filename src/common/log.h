// Logging for code that runs inside other people's processes: formats into a stack buffer
// and writes it to stderr with one write(2). No allocation, no locks, no C++ runtime.
//
// TESSERA_LOG_LEVEL = off | error | warn | info | debug. The default, error, prints only
// what stops CUDA from working (a malformed limit, a corrupt ledger), so a healthy process
// hears nothing from Tessera.
#pragma once

namespace tessera {

enum class LogLevel { off = 0, error = 1, warn = 2, info = 3, debug = 4 };

// Reads TESSERA_LOG_LEVEL once; later calls return the same value.
LogLevel log_level();
// A level's name as TESSERA_LOG_LEVEL spells it; false if `name` is none (null included).
bool parse_log_level(const char* name, LogLevel& level);
// How a log line names a level: "error", "warning", "info", "debug".
const char* log_level_name(LogLevel level);

[[gnu::format(printf, 3, 4)]] void log(LogLevel level, const char* component, const char* format,
                                       ...);

}  // namespace tessera
