// The simulated nvidia-cuda-mps-control: the MPS control daemon (-d, or -f in the
// foreground) and its command client (no option: commands on standard input), for machines
// without an NVIDIA driver. See sim_mps.h for the protocol and docs/mps.md for what is
// simulated.
//
// The daemon keeps NVIDIA's defaults that clients start with (active thread percentage,
// pinned device memory limit per device), answers get_server_list with its own PID once a
// client has attached (the simulation has no separate server process), and records every
// command it took in control.log, as the real one does.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "simgpu/sim_mps.h"

namespace {

using tessera::sim::kMpsAttach;
using tessera::sim::kMpsMostLine;

struct Directories {
  std::string pipe, log;
};

Directories directories() {
  const char* pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const char* log = std::getenv("CUDA_MPS_LOG_DIRECTORY");
  return {pipe != nullptr && *pipe != '\0' ? pipe : tessera::sim::kMpsDefaultPipeDirectory,
          log != nullptr && *log != '\0' ? log : tessera::sim::kMpsDefaultLogDirectory};
}

bool socket_address(const std::string& pipe, sockaddr_un& address) {
  const std::string path = pipe + "/control";
  std::memset(&address, 0, sizeof address);
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) return false;
  std::memcpy(address.sun_path, path.c_str(), path.size());
  return true;
}

// Reads one line (without its newline) of at most kMpsMostLine bytes; false on EOF, error or
// an overlong line.
bool read_line(int fd, std::string& line) {
  line.clear();
  char c = 0;
  while (line.size() <= kMpsMostLine) {
    const ssize_t got = read(fd, &c, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    if (c == '\n') return true;
    line.push_back(c);
  }
  return false;
}

void write_all(int fd, const std::string& text) {
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t wrote = write(fd, text.data() + done, text.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return;
    done += static_cast<std::size_t>(wrote);
  }
}

std::string format_percentage(double percent) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f\n", percent);
  return text;
}

class Daemon {
 public:
  explicit Daemon(Directories where) : where_(std::move(where)) {}

  // Binds the control socket; false (with a message) if it cannot, or another daemon answers.
  bool bind_control(std::string& error) {
    for (const std::string& directory : {where_.pipe, where_.log}) {
      std::error_code failed;
      std::filesystem::create_directories(directory, failed);
      if (failed) {
        error = "cannot create " + directory + ": " + failed.message();
        return false;
      }
    }
    sockaddr_un address{};
    if (!socket_address(where_.pipe, address)) {
      error = "the pipe directory's path is too long for a socket: " + where_.pipe;
      return false;
    }
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool running = connect(probe, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    close(probe);
    if (running) {
      error = "An instance of this daemon is already running (" + where_.pipe + ")";
      return false;
    }
    unlink(address.sun_path);  // a stale socket of a daemon that died
    listener_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener_ < 0 ||
        bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        listen(listener_, 64) != 0) {
      error = std::string("cannot listen on ") + address.sun_path + ": " + std::strerror(errno);
      return false;
    }
    control_path_ = address.sun_path;
    log_ = std::fopen((where_.log + "/control.log").c_str(), "a");
    record("Starting control daemon using socket " + control_path_);
    return true;
  }

  int serve() {
    signal(SIGPIPE, SIG_IGN);
    while (!quit_) {
      std::vector<pollfd> watched{{listener_, POLLIN, 0}};
      for (const auto& [fd, pid] : clients_) watched.push_back({fd, POLLIN, 0});
      if (poll(watched.data(), watched.size(), -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      for (std::size_t i = 1; i < watched.size(); ++i) {
        if (watched[i].revents == 0) continue;
        char ignored[64];
        if (read(watched[i].fd, ignored, sizeof ignored) > 0) continue;  // clients say nothing
        record("Client " + std::to_string(clients_[watched[i].fd]) + " disconnected");
        close(watched[i].fd);
        clients_.erase(watched[i].fd);
      }
      if ((watched[0].revents & POLLIN) != 0) accept_one();
    }
    record("exit");
    unlink(control_path_.c_str());
    for (const auto& [fd, pid] : clients_) close(fd);
    return 0;
  }

 private:
  void record(const std::string& text) {
    if (log_ == nullptr) return;
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
    std::fprintf(log_, "[%s] %s\n", stamp, text.c_str());
    std::fflush(log_);
  }

  void accept_one() {
    const int connection = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) return;
    timeval patience{1, 0};  // a peer that sends nothing in a second is dropped
    setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
    std::string line;
    if (!read_line(connection, line)) {
      close(connection);
      return;
    }
    if (line.rfind(kMpsAttach, 0) == 0) {
      const long pid = std::strtol(line.c_str() + std::strlen(kMpsAttach), nullptr, 10);
      std::string reply = "server " + std::to_string(getpid()) + "\nthreads " +
                          std::to_string(thread_percentage_) + "\n";
      for (const auto& [device, bytes] : pinned_)
        reply += "limit " + std::to_string(device) + " " + std::to_string(bytes) + "\n";
      write_all(connection, reply + "end\n");
      clients_[connection] = pid;
      record("New client " + std::to_string(pid) + " connected");
      return;
    }
    record("Accepting command: " + line);
    write_all(connection, answer(line));
    close(connection);
  }

  std::string answer(const std::string& line) {
    std::vector<std::string> words;
    for (std::size_t at = 0; at < line.size();) {
      const std::size_t end = line.find(' ', at);
      const std::string word = line.substr(at, end == std::string::npos ? end : end - at);
      if (!word.empty()) words.push_back(word);
      if (end == std::string::npos) break;
      at = end + 1;
    }
    const std::string command = words.empty() ? "" : words[0];
    if (command == "quit" && words.size() == 1) {
      quit_ = true;
      return "";
    }
    if (command == "get_server_list" && words.size() == 1) {
      return clients_.empty() ? "" : std::to_string(getpid()) + "\n";
    }
    if (command == "set_default_active_thread_percentage" && words.size() == 2) {
      char* end = nullptr;
      const double percent = std::strtod(words[1].c_str(), &end);
      if (end == words[1].c_str() || *end != '\0' || !(percent > 0 && percent <= 100)) {
        return "Invalid active thread percentage: " + words[1] + "\n";
      }
      thread_percentage_ = percent;
      return format_percentage(percent);
    }
    if (command == "get_default_active_thread_percentage" && words.size() == 1) {
      return format_percentage(thread_percentage_);
    }
    if (command == "set_default_device_pinned_mem_limit" && words.size() == 3) {
      char* end = nullptr;
      const long device = std::strtol(words[1].c_str(), &end, 10);
      std::uint64_t bytes = 0;
      if (end == words[1].c_str() || *end != '\0' || device < 0 ||
          device >= tessera::kMostDevices) {
        return "Invalid device: " + words[1] + "\n";
      }
      if (!tessera::sim::parse_mps_memory(words[2].c_str(), bytes) || bytes == 0) {
        return "Invalid memory limit: " + words[2] + "\n";
      }
      pinned_[static_cast<int>(device)] = bytes;
      return "";
    }
    if (command == "get_default_device_pinned_mem_limit" && words.size() == 2) {
      char* end = nullptr;
      const long device = std::strtol(words[1].c_str(), &end, 10);
      const auto found = pinned_.find(static_cast<int>(device));
      if (end == words[1].c_str() || *end != '\0' || found == pinned_.end()) return "none\n";
      return std::to_string(found->second >> 20) + "M\n";
    }
    return "Unrecognized command: " + line.substr(0, 64) + "\n";
  }

  Directories where_;
  int listener_ = -1;
  std::string control_path_;
  std::FILE* log_ = nullptr;
  bool quit_ = false;
  double thread_percentage_ = 100;
  std::map<int, std::uint64_t> pinned_;  // by device index
  std::map<int, long> clients_;          // connection -> client PID
};

// Commands from standard input, each sent to the daemon and its answer printed.
int send_commands(const Directories& where) {
  sockaddr_un address{};
  if (!socket_address(where.pipe, address)) {
    std::fprintf(stderr, "the pipe directory's path is too long for a socket: %s\n",
                 where.pipe.c_str());
    return 1;
  }
  std::string line;
  while (read_line(STDIN_FILENO, line)) {
    if (line.empty()) continue;
    const int connection = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(connection, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      close(connection);
      std::fprintf(stderr, "Cannot find MPS control daemon process\n");
      return 1;
    }
    write_all(connection, line + "\n");
    char buffer[512];
    for (ssize_t got = 0; (got = read(connection, buffer, sizeof buffer)) > 0;) {
      std::fwrite(buffer, 1, static_cast<std::size_t>(got), stdout);
    }
    close(connection);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const Directories where = directories();
  if (mode.empty()) return send_commands(where);
  if (mode != "-d" && mode != "-f") {
    std::fprintf(stderr, "usage: nvidia-cuda-mps-control [-d | -f]\n");
    return 2;
  }
  Daemon daemon(where);
  std::string error;
  if (!daemon.bind_control(error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  if (mode == "-f") return daemon.serve();
  // -d: the caller returns once the socket answers; the daemon lives on on its own.
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child > 0) return 0;
  setsid();
  const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  dup2(null, STDIN_FILENO);
  dup2(null, STDOUT_FILENO);
  dup2(null, STDERR_FILENO);
  return daemon.serve();
}
