#include "node/compute_policy.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

extern char** environ;

namespace tessera::node {
namespace {

constexpr auto kToolPatience = std::chrono::seconds(10);

// Runs argv with the agent's environment and its output discarded; its exit status, or a
// reason it has none (it could not start, or took longer than kToolPatience and was killed).
int run_tool(std::vector<std::string> argv, std::string& why) {
  std::vector<char*> pointers;
  for (std::string& argument : argv) pointers.push_back(argument.data());
  pointers.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int failed = posix_spawnp(&pid, pointers[0], &actions, nullptr, pointers.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (failed != 0) {
    why = fmt::format("cannot run {}: {}", argv[0], std::strerror(failed));
    return -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + kToolPatience;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      why = fmt::format("{} did not finish within {} s", argv[0], kToolPatience.count());
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a short-lived tool
  }
  if (!WIFEXITED(status)) {
    why = fmt::format("{} was ended by signal {}", argv[0], WTERMSIG(status));
    return -1;
  }
  return WEXITSTATUS(status);
}

}  // namespace

const char* timeslice_name(int timeslice) {
  static const char* const names[] = {"default", "short", "medium", "long"};
  return timeslice >= 0 && timeslice <= 3 ? names[timeslice] : "?";
}

bool apply_compute_timeslice(const std::string& nvidia_smi, const Inventory& inventory,
                             int timeslice, const base::Reporter& report) {
  bool all = true;
  for (const GpuInfo& gpu : inventory.gpus) {
    std::string why;
    const int status = run_tool({nvidia_smi, "compute-policy", "-i", std::to_string(gpu.index),
                                 "--set-timeslice", std::to_string(timeslice)},
                                why);
    if (status == 0) continue;
    all = false;
    report(fmt::format("GPU {}: the time slice stays as it was: {}", gpu.index,
                       status < 0 ? why : fmt::format("{} exited {}", nvidia_smi, status)));
  }
  if (all) {
    report(fmt::format("time slice {} set on {} GPU(s) (nvidia-smi compute-policy)",
                       timeslice_name(timeslice), inventory.gpus.size()));
  }
  return all;
}

}  // namespace tessera::node
