// Files as host code writes and watches them: whole or not at all, and without polling where
// the kernel can say what changed.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera::base {

// Writes `content` to `path` through a hidden temporary beside it renamed into place, so a
// reader sees the old file or the new one, never part of one. A failure names the file.
Status write_file_atomically(const std::string& path, std::string_view content);

// Puts a copy of `source` at `target` through a new file renamed into place: a library in use
// by running processes keeps its old inode. Throws std::runtime_error naming the file.
void install_file(const std::string& source, const std::string& target);

// Whether a process listens on the unix socket at `path` (a socket file left by a process that
// is gone accepts nothing).
bool socket_answers(const std::string& path);

// inotify on one directory. Without inotify, waits are sleeps and see nothing: the caller's
// own polling then finds the changes.
class DirectoryWatch {
 public:
  DirectoryWatch(const std::string& directory, std::uint32_t mask);
  ~DirectoryWatch();
  DirectoryWatch(const DirectoryWatch&) = delete;
  DirectoryWatch& operator=(const DirectoryWatch&) = delete;

  bool watching() const { return fd_ >= 0; }
  // Waits up to `timeout` for events; the names of the entries they concern.
  std::vector<std::string> wait(std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
};

}  // namespace tessera::base
