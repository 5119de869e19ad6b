// The simulated driver as an MPS client: a process whose pipe directory holds a control
// socket attaches to that daemon and is held to its limits (sim_mps.h).
#include "simgpu/sim_mps_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "contract/variables.h"

namespace tessera::sim {
namespace {

// Lowers `limits` by the client's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=1G,1=2G"): a client may ask for less than the
// daemon's defaults, never more.
void apply_client_environment(MpsClientLimits& limits) {
  if (const char* text = std::getenv(contract::kMpsThreadPercentageVariable); text != nullptr) {
    char* end = nullptr;
    const double percent = std::strtod(text, &end);
    if (end != text && *end == '\0' && percent > 0 && percent < limits.thread_percentage) {
      limits.thread_percentage = percent;
    }
  }
  const char* list = std::getenv(contract::kMpsMemoryLimitVariable);
  for (const char* cursor = list; cursor != nullptr && *cursor != '\0';) {
    const char* end = std::strchr(cursor, ',');
    const std::size_t length = end ? static_cast<std::size_t>(end - cursor) : std::strlen(cursor);
    char item[64] = {};
    if (length < sizeof item) {
      std::memcpy(item, cursor, length);
      char* equals = std::strchr(item, '=');
      std::uint64_t bytes = 0;
      if (equals != nullptr) {
        *equals = '\0';
        char* number_end = nullptr;
        const long ordinal = std::strtol(item, &number_end, 10);
        if (number_end != item && *number_end == '\0' && ordinal >= 0 && ordinal < kMostDevices &&
            parse_mps_memory(equals + 1, bytes) && bytes > 0) {
          std::uint64_t& limit = limits.pinned_bytes[ordinal];
          if (limit == 0 || bytes < limit) limit = bytes;
        }
      }
    }
    cursor = end ? end + 1 : nullptr;
  }
}

// Reads the daemon's answer to an attach, up to its "end" line (at most 2 s, 4 KiB).
bool read_defaults(int fd, MpsClientLimits& limits) {
  char text[4096];
  std::size_t used = 0;
  while (used < sizeof text - 1) {
    pollfd ready{fd, POLLIN, 0};
    if (poll(&ready, 1, 2000) <= 0) return false;
    const ssize_t got = read(fd, text + used, sizeof text - 1 - used);
    if (got <= 0) return false;
    used += static_cast<std::size_t>(got);
    text[used] = '\0';
    if (std::strstr(text, "end\n") != nullptr) break;
  }
  if (std::strstr(text, "end\n") == nullptr) return false;
  limits.server = 0;
  for (char* line = std::strtok(text, "\n"); line != nullptr; line = std::strtok(nullptr, "\n")) {
    double percent = 0;
    int ordinal = -1, server = 0;
    unsigned long long bytes = 0;
    if (std::sscanf(line, "server %d", &server) == 1 && server > 0) {
      limits.server = server;
    } else if (std::sscanf(line, "threads %lf", &percent) == 1 && percent > 0 && percent <= 100) {
      limits.thread_percentage = percent;
    } else if (std::sscanf(line, "limit %d %llu", &ordinal, &bytes) == 2 && ordinal >= 0 &&
               ordinal < kMostDevices) {
      limits.pinned_bytes[ordinal] = bytes;
    }
  }
  return limits.server > 0;
}

}  // namespace

abi::CUresult attach_mps(MpsClient& client) {
  const char* pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  char path[sizeof(sockaddr_un::sun_path)];
  const int length =
      std::snprintf(path, sizeof path, "%s/control",
                    pipe != nullptr && *pipe != '\0' ? pipe : kMpsDefaultPipeDirectory);
  struct stat info {};
  if (length <= 0 || static_cast<std::size_t>(length) >= sizeof path || stat(path, &info) != 0 ||
      !S_ISSOCK(info.st_mode)) {
    return abi::CUDA_SUCCESS;  // no daemon here: not an MPS client
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path, static_cast<std::size_t>(length));
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    if (fd >= 0) close(fd);
    return abi::CUDA_ERROR_MPS_CONNECTION_FAILED;  // a socket nobody answers: the daemon died
  }
  char hello[64];
  const int said = std::snprintf(hello, sizeof hello, "%s %d\n", kMpsAttach, getpid());
  MpsClientLimits limits;
  if (write(fd, hello, static_cast<std::size_t>(said)) != said || !read_defaults(fd, limits)) {
    close(fd);
    return abi::CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
  apply_client_environment(limits);
  client.fd = fd;
  client.limits = limits;
  return abi::CUDA_SUCCESS;
}

bool mps_daemon_gone(const MpsClient& client) {
  if (client.fd < 0) return false;
  pollfd ready{client.fd, POLLIN | POLLRDHUP, 0};
  // The daemon never writes after its answer: anything readable is its end.
  return poll(&ready, 1, 0) != 0;
}

void forget_mps(MpsClient& client) {
  if (client.fd >= 0) close(client.fd);
  client = MpsClient{};
}

}  // namespace tessera::sim
