#include "base/files.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

namespace tessera::base {

namespace fs = std::filesystem;

Status write_file_atomically(const std::string& path, std::string_view content) {
  // Hidden, so that readers of the whole directory (node-feature-discovery's local source)
  // never take it for a file of theirs.
  const fs::path target(path);
  const std::string temporary =
      (target.parent_path() / ("." + target.filename().string() + ".tmp")).string();
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::failure(fmt::format("cannot write {}: {}", temporary, std::strerror(errno)));
  }
  std::size_t written = 0;
  while (written < content.size()) {
    const ssize_t step = write(fd, content.data() + written, content.size() - written);
    if (step < 0 && errno == EINTR) continue;
    if (step <= 0) break;
    written += static_cast<std::size_t>(step);
  }
  const int write_errno = errno;
  const bool closed = close(fd) == 0;
  if (written != content.size() || !closed || rename(temporary.c_str(), path.c_str()) != 0) {
    const Status failed = Status::failure(
        fmt::format("cannot write {}: {}", path,
                    std::strerror(written != content.size() ? write_errno : errno)));
    unlink(temporary.c_str());
    return failed;
  }
  return Status::success();
}

void install_file(const std::string& source, const std::string& target) {
  std::error_code error;
  if (fs::exists(target, error) && fs::equivalent(source, target, error)) return;
  const std::string temporary = target + ".new";
  fs::copy_file(source, temporary, fs::copy_options::overwrite_existing, error);
  if (error)
    throw std::runtime_error(
        fmt::format("cannot copy {} to {}: {}", source, temporary, error.message()));
  fs::permissions(temporary,
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                      fs::perms::others_read | fs::perms::others_exec,
                  error);
  fs::rename(temporary, target, error);
  if (error)
    throw std::runtime_error(fmt::format("cannot install {}: {}", target, error.message()));
}

DirectoryWatch::DirectoryWatch(const std::string& directory, std::uint32_t mask) {
  fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd_ >= 0 && inotify_add_watch(fd_, directory.c_str(), mask) < 0) {
    close(fd_);
    fd_ = -1;
  }
}

DirectoryWatch::~DirectoryWatch() {
  if (fd_ >= 0) close(fd_);
}

std::vector<std::string> DirectoryWatch::wait(std::chrono::milliseconds timeout) {
  std::vector<std::string> names;
  if (fd_ < 0) {
    std::this_thread::sleep_for(timeout);  // no inotify: the caller polls
    return names;
  }
  pollfd ready{fd_, POLLIN, 0};
  if (poll(&ready, 1, static_cast<int>(timeout.count())) <= 0) return names;
  alignas(inotify_event) char buffer[16384];
  for (;;) {
    const ssize_t length = read(fd_, buffer, sizeof buffer);
    if (length <= 0) break;
    for (ssize_t at = 0; at < length;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
      names.emplace_back(event->len > 0 ? event->name : "");
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
    }
  }
  return names;
}

bool socket_answers(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) return false;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool answered =
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return answered;
}

}  // namespace tessera::base
