// How host code says that something it was asked to do did not happen, and why, as LevelDB's
// Status does: success, or a failure with a message that names what failed (the file, the
// object, the field) for the person reading the log. [[nodiscard]]: a failure cannot be
// dropped by accident.
//
// Host code's rule: an operation that can fail for reasons outside the program (a file, a
// socket, the API server, the kubelet) returns a Status; a value with it comes through an
// out-parameter or a std::optional beside it. Exceptions stay inside parsers (DocumentError,
// thrown from deep in a document and caught at its entry point) and for broken invariants.
// Guest code (the hook, the simulated libraries) has no std::string: it keeps
// common/limits.h's ErrorText.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace tessera::base {

class [[nodiscard]] Status {
 public:
  static Status success() { return Status(); }
  static Status failure(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  // Why it failed; "" on success.
  const std::string& message() const { return message_; }
  // The same failure with what was being done in front: "<context>: <message>".
  Status within(std::string_view context) const {
    return ok() ? *this : failure(std::string(context) + ": " + message_);
  }

 private:
  Status() = default;
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}

  bool failed_ = false;
  std::string message_;
};

}  // namespace tessera::base
