#include "node/mps.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "common/limits.h"

extern char** environ;

namespace tessera::node {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kStartPatience = std::chrono::seconds(5);
constexpr auto kAnswerPatience = std::chrono::milliseconds(1000);
constexpr auto kQuitPatience = std::chrono::seconds(2);
constexpr std::uint64_t kProbeEvery = 5;

std::string resource_directory(const PluginConfig& config, const std::string& resource) {
  return (fs::path(config.flags.mps_root) / resource).string();
}

// The MPS shared memory every client of the node's daemons maps, given to containers as /dev/shm.
std::string shm_directory(const PluginConfig& config) {
  return (fs::path(config.flags.mps_root) / "shm").string();
}

// Runs `control -f` with the daemon's environment; its PID, or 0 (with errno's reason).
pid_t spawn_daemon(const std::string& control, const MpsDaemonSpec& spec, std::string& why) {
  std::map<std::string, std::string> variables;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::size_t equals = text.find('=');
    if (equals != std::string::npos) variables[text.substr(0, equals)] = text.substr(equals + 1);
  }
  std::string visible;
  for (const std::string& uuid : spec.uuids) visible += (visible.empty() ? "" : ",") + uuid;
  variables["CUDA_VISIBLE_DEVICES"] = visible;
  variables["CUDA_MPS_PIPE_DIRECTORY"] = spec.pipe_dir;
  variables["CUDA_MPS_LOG_DIRECTORY"] = spec.log_dir;
  std::vector<std::string> texts;
  for (const auto& [key, value] : variables) texts.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& text : texts) envp.push_back(text.data());
  envp.push_back(nullptr);
  std::string program = control;
  std::string foreground = "-f";
  char* argv[] = {program.data(), foreground.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int failed = posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (failed != 0) {
    why = fmt::format("cannot run {}: {}", control, std::strerror(failed));
    return 0;
  }
  return pid;
}

// Whether `pid` (our child) has ended; reaps it.
bool ended(pid_t pid) {
  if (pid <= 0) return true;
  int status = 0;
  const pid_t result = waitpid(pid, &status, WNOHANG);
  return result == pid || (result < 0 && errno == ECHILD);
}

}  // namespace

std::vector<MpsDaemonSpec> mps_daemon_specs(const Inventory& inventory, const PluginConfig& config,
                                            const ResourceMap& map) {
  std::vector<MpsDaemonSpec> specs;
  for (const Resource& resource : map.resources) {
    if (!resource.mps) continue;
    MpsDaemonSpec spec;
    spec.resource = resource.name;
    const std::string root = resource_directory(config, resource.name);
    spec.pipe_dir = root + "/pipe";
    spec.log_dir = root + "/log";
    spec.shm_dir = shm_directory(config);
    const int replicas = std::max(resource.replicas, 1);
    spec.thread_percentage = std::max(100 / replicas, 1);
    for (const AdvertisedDevice& device : resource.devices) {
      if (std::find(spec.gpus.begin(), spec.gpus.end(), device.gpu) != spec.gpus.end()) continue;
      const GpuInfo& gpu = inventory.gpus[static_cast<std::size_t>(device.gpu)];
      spec.gpus.push_back(device.gpu);
      spec.uuids.push_back(gpu.uuid);
      spec.pinned_bytes.push_back(mps_replica_memory(gpu.memory_bytes, replicas));
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::uint64_t mps_replica_memory(std::uint64_t memory_bytes, int replicas) {
  constexpr std::uint64_t kMiB = 1ull << 20;
  return memory_bytes / static_cast<std::uint64_t>(std::max(replicas, 1)) / kMiB * kMiB;
}

ContainerGrant mps_container_grant(const Inventory& inventory, const Resource& resource,
                                   const std::vector<std::string>& ids) {
  ContainerGrant grant;
  grant.gpus = requested_gpus(resource, ids);
  for (const int gpu : grant.gpus) {
    const std::uint64_t share = mps_replica_memory(
        inventory.gpus[static_cast<std::size_t>(gpu)].memory_bytes, resource.replicas);
    std::uint64_t replicas = 0;
    bool whole = false;
    for (const std::string& id : ids) {
      const AdvertisedDevice* device = resource.find(id);
      if (device->gpu != gpu) continue;
      whole = whole || device->replica < 0;
      ++replicas;
    }
    grant.memory_bytes.push_back(whole ? kUnlimited : replicas * share);
    grant.cores.push_back(0);
  }
  grant.source = "the MPS replicas' share";
  return grant;
}

void add_mps_access(ContainerAllocation& allocation, const PluginConfig& config,
                    const std::string& resource) {
  const std::string pipe = resource_directory(config, resource) + "/pipe";
  allocation.envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe;
  allocation.mounts.push_back({pipe, pipe, false});
  allocation.mounts.push_back({"/dev/shm", shm_directory(config), false});
}

std::optional<std::string> mps_command(const std::string& pipe_dir, const std::string& command,
                                       std::chrono::milliseconds timeout) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = pipe_dir + "/control";
  if (path.size() >= sizeof address.sun_path) return std::nullopt;
  std::memcpy(address.sun_path, path.c_str(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> answer;
  const std::string line = command + "\n";
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size())) {
    std::string text;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd ready{fd, POLLIN, 0};
      if (left.count() <= 0 || poll(&ready, 1, static_cast<int>(left.count())) <= 0) break;
      char buffer[512];
      const ssize_t got = read(fd, buffer, sizeof buffer);
      if (got < 0) break;
      if (got == 0) {  // the daemon answered and closed: the whole answer
        answer = text;
        break;
      }
      if (text.size() < 64 * 1024) text.append(buffer, static_cast<std::size_t>(got));
    }
  }
  close(fd);
  return answer;
}

MpsSupervisor::MpsSupervisor(std::string control, HealthBoard& board, std::function<void()> changed,
                             base::Reporter report, std::chrono::milliseconds check_every)
    : control_(std::move(control)),
      board_(board),
      changed_(std::move(changed)),
      report_(std::move(report)),
      check_every_(check_every),
      thread_([this] { run(); }) {}

MpsSupervisor::~MpsSupervisor() {
  {
    base::MutexLock locked(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (Daemon& daemon : daemons_) stop(daemon);
}

bool MpsSupervisor::start(Daemon& daemon, std::string& why) {
  std::error_code error;
  fs::create_directories(daemon.spec.pipe_dir, error);
  fs::create_directories(daemon.spec.log_dir, error);
  fs::create_directories(daemon.spec.shm_dir, error);  // mounted into its clients' containers
  daemon.pid = spawn_daemon(control_, daemon.spec, why);
  if (daemon.pid == 0) return false;
  const auto deadline = Clock::now() + kStartPatience;
  while (!mps_command(daemon.spec.pipe_dir, "get_server_list", kAnswerPatience)) {
    if (ended(daemon.pid) || Clock::now() > deadline) {
      why = fmt::format("{} -f did not answer on {}", control_, daemon.spec.pipe_dir);
      stop(daemon);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling its socket's start
  }
  // NVIDIA's defaults for each client: its share of the SMs and of each GPU's memory.
  std::vector<std::string> commands{
      fmt::format("set_default_active_thread_percentage {}", daemon.spec.thread_percentage)};
  for (std::size_t i = 0; i < daemon.spec.gpus.size(); ++i) {
    commands.push_back(fmt::format("set_default_device_pinned_mem_limit {} {}M", i,
                                   daemon.spec.pinned_bytes[i] >> 20));
  }
  for (const std::string& command : commands) {
    const std::optional<std::string> answer =
        mps_command(daemon.spec.pipe_dir, command, kAnswerPatience);
    if (!answer || answer->find("Invalid") != std::string::npos) {
      why = fmt::format("the daemon of {} refused '{}': {}", daemon.spec.resource, command,
                        answer ? *answer : "no answer");
      stop(daemon);
      return false;
    }
  }
  return true;
}

void MpsSupervisor::stop(Daemon& daemon) {
  if (daemon.pid <= 0) return;
  mps_command(daemon.spec.pipe_dir, "quit", kAnswerPatience);
  const auto deadline = Clock::now() + kQuitPatience;
  while (!ended(daemon.pid)) {
    if (Clock::now() > deadline) {
      kill(daemon.pid, SIGKILL);
      waitpid(daemon.pid, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling its exit
  }
  daemon.pid = 0;
}

void MpsSupervisor::mark(Daemon& daemon, const std::string& why) {
  bool changed = false;
  for (const int gpu : daemon.spec.gpus) {
    changed |= board_.set_service_down(
        gpu, why.empty() ? "" : fmt::format("MPS daemon of {}: {}", daemon.spec.resource, why));
  }
  if (changed && changed_) changed_();
}

void MpsSupervisor::apply(const std::vector<MpsDaemonSpec>& specs) {
  base::MutexLock locked(mutex_);
  for (auto it = daemons_.begin(); it != daemons_.end();) {
    if (std::find(specs.begin(), specs.end(), it->spec) != specs.end()) {
      ++it;
      continue;
    }
    report_(fmt::format("stopping the MPS daemon of {}", it->spec.resource));
    stop(*it);
    mark(*it, "");
    it = daemons_.erase(it);
  }
  for (const MpsDaemonSpec& spec : specs) {
    const bool running = std::any_of(daemons_.begin(), daemons_.end(),
                                     [&](const Daemon& daemon) { return daemon.spec == spec; });
    if (running) continue;
    Daemon daemon{spec};
    std::string why;
    if (start(daemon, why)) {
      report_(fmt::format("MPS daemon of {} running (PID {}) on {}", spec.resource, daemon.pid,
                          spec.pipe_dir));
      mark(daemon, "");
    } else {
      report_(fmt::format("MPS daemon of {} cannot start: {}", spec.resource, why));
      mark(daemon, why);
    }
    daemons_.push_back(std::move(daemon));
  }
}

void MpsSupervisor::run() {
  base::MutexLock locked(mutex_);
  while (!stopping_) {
    const auto deadline = Clock::now() + check_every_;
    while (!stopping_ && wake_.wait_until(mutex_, deadline)) {
    }
    if (stopping_) break;
    // Every check sees a daemon that exited; every kProbeEvery-th asks each daemon something,
    // which it records in its log, so the log grows by a line a probe, not a line a check.
    const bool probe = ++checks_ % kProbeEvery == 0;
    for (Daemon& daemon : daemons_) {
      std::string why;
      if (daemon.pid > 0 && ended(daemon.pid)) {
        daemon.pid = 0;
        why = "it exited";
      } else if (daemon.pid > 0 && probe &&
                 !mps_command(daemon.spec.pipe_dir, "get_server_list", kAnswerPatience)) {
        why = "its pipe does not answer";
        kill(daemon.pid, SIGKILL);  // hung: replaced below
        waitpid(daemon.pid, nullptr, 0);
        daemon.pid = 0;
      } else if (daemon.pid == 0) {
        why = "it is not running";
      }
      if (why.empty()) continue;
      report_(fmt::format("MPS daemon of {}: {}; restarting it", daemon.spec.resource, why));
      mark(daemon, why);
      std::string failure;
      if (start(daemon, failure)) {
        report_(fmt::format("MPS daemon of {} running again (PID {})", daemon.spec.resource,
                            daemon.pid));
        mark(daemon, "");
      } else {
        report_(fmt::format("MPS daemon of {} cannot start: {}", daemon.spec.resource, failure));
      }
    }
  }
}

}  // namespace tessera::node
