// tessera run: start a command in a sharing group with a memory limit on its GPU.
#include <fmt/core.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/environment.h"
#include "common/limits.h"
#include "common/units.h"
#include "contract/variables.h"
#include "ledger/ledger.h"

namespace tessera::cli {
namespace {

pid_t child_pid = 0;

void forward_signal(int signal_number) {
  if (child_pid > 0) kill(child_pid, signal_number);
}

bool valid_group_name(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return false;
    }
  }
  return name.front() != '.';
}

// Refuses arguments that cannot be right, before anything is created.
void check_arguments(const RunOptions& options, std::uint64_t& memory_limit) {
  memory_limit = kUnlimited;
  if (!options.memory.empty() && (!parse_size(options.memory, memory_limit) || memory_limit == 0)) {
    throw UsageError(
        fmt::format("--memory '{}' is not a size larger than 0 (write e.g. 8GiB, 512MiB or 8g)",
                    options.memory));
  }
  if (options.cores && (*options.cores < 1 || *options.cores > 100)) {
    throw UsageError(fmt::format("--cores {} must be a percentage from 1 to 100", *options.cores));
  }
  if (options.device && (*options.device < 0 || *options.device >= kMostDevices)) {
    throw UsageError(
        fmt::format("--device {} is out of range (0 to {})", *options.device, kMostDevices - 1));
  }
  if (!options.group.empty() && !valid_group_name(options.group)) {
    throw UsageError(fmt::format("--group '{}' must be 1 to 63 letters, digits, '-', '_' or '.'",
                                 options.group));
  }
  if (options.command.empty()) throw UsageError("no command given after --");
  if (options.burst && !options.cores) throw UsageError("--burst needs --cores");
  if (!options.priority.empty() && options.priority != "high" && options.priority != "low") {
    throw UsageError(fmt::format("--priority '{}' must be high or low", options.priority));
  }
  if (options.tolerance && options.priority != "high") {
    throw UsageError("--priority-tolerance needs --priority high");
  }
  if (options.tolerance && (*options.tolerance < 1 || *options.tolerance > 100)) {
    throw UsageError(
        fmt::format("--priority-tolerance {} must be from 1 to 100", *options.tolerance));
  }
}

}  // namespace

int run_command(const RunOptions& options) {
  std::uint64_t limit = kUnlimited;
  check_arguments(options, limit);
  const std::string group = options.group.empty() ? fmt::format("run-{}", getpid()) : options.group;

  const Installation installation = locate_installation();
  const bool simulated = use_simulated_gpu(installation);
  if (simulated) {
    fmt::print(stderr, "tessera: no NVIDIA driver found; using the simulated GPU\n");
    prepend_to_path_variable("LD_LIBRARY_PATH", installation.simulator_dir, ':');
  }
  if (options.device) {
    const std::size_t gpus = machine_inventory(installation, simulated).gpus.size();
    if (static_cast<std::size_t>(*options.device) >= gpus) {
      throw UsageError(fmt::format("--device {}: this machine has {} GPU{} (0 to {})",
                                   *options.device, gpus, gpus == 1 ? "" : "s",
                                   gpus == 0 ? 0 : gpus - 1));
    }
  }

  // The group sees one GPU with --device (as its device 0), else every GPU, each limited.
  ledger::GroupSpec spec;
  spec.name = group.c_str();
  if (!options.priority.empty()) {
    spec.priority = options.priority == "high" ? Priority::high : Priority::low;
  }
  spec.burst = options.burst;
  const auto cores = static_cast<std::uint32_t>(options.cores.value_or(0));
  for (auto& percent : spec.limits.core_percent) percent = options.device ? 0 : cores;
  spec.limits.core_percent[0] = cores;
  if (options.device) {
    spec.limits.memory_bytes[0] = limit;
    setenv("CUDA_VISIBLE_DEVICES", std::to_string(*options.device).c_str(), 1);
  } else {
    for (auto& bytes : spec.limits.memory_bytes) bytes = limit;
  }
  const std::string path = fmt::format("{}/{}.ledger", runtime_directory(), group);
  ledger::Ledger ledger;
  ErrorText error;
  // Kept in place while this run lasts: a run of the same group ending first cannot remove
  // it before this one's workload has joined.
  if (!ledger.create_or_open_kept(path.c_str(), spec, error)) {
    throw std::runtime_error(error.text);
  }

  setenv(contract::kLedgerVariable, path.c_str(), 1);
  // The group's limits in the environment too (the hook holds a process to the lower of these
  // and the ledger's), through the one writer of their form.
  char memory[512], shares[512];
  std::uint64_t percent[kMostDevices];
  for (int device = 0; device < kMostDevices; ++device)
    percent[device] = spec.limits.core_percent[device];
  format_limit_list(spec.limits.memory_bytes, kMostDevices, memory, sizeof memory);
  format_limit_list(percent, kMostDevices, shares, sizeof shares);
  if (memory[0] != '\0') setenv(contract::kMemoryLimitVariable, memory, 1);
  if (shares[0] != '\0') setenv(contract::kCoreLimitVariable, shares, 1);
  if (options.burst) setenv(contract::kBurstVariable, "1", 1);
  if (!options.priority.empty()) setenv(contract::kPriorityVariable, options.priority.c_str(), 1);
  if (options.tolerance) {
    setenv(contract::kPriorityToleranceVariable, std::to_string(*options.tolerance).c_str(), 1);
  }
  prepend_to_path_variable("LD_PRELOAD", installation.hook_library, ':');

  child_pid = fork();
  if (child_pid < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (child_pid == 0) {
    std::vector<char*> argv;
    for (const std::string& word : options.command) argv.push_back(const_cast<char*>(word.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    fmt::print(stderr, "tessera run: cannot run '{}': {}\n", options.command[0],
               std::strerror(errno));
    _exit(127);
  }
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
    signal(signal_number, forward_signal);
  int status = 0;
  while (waitpid(child_pid, &status, 0) < 0 && errno == EINTR) {
  }

  ledger::DeviceUsage usage[kMostDevices];
  for (int device = 0; device < kMostDevices; ++device) usage[device] = ledger.usage(device);
  if (const char* damage = ledger.damage(); damage != nullptr) {
    fmt::print(stderr, "tessera: group {}: {}; its usage is unknown\n", group, damage);
  } else if (options.summary) {
    for (int device = 0; device < kMostDevices; ++device) {
      const ledger::DeviceUsage& used = usage[device];
      if (used.peak == 0 && used.rejections == 0 && (options.device || device > 0)) continue;
      fmt::print(stderr, "tessera: group {} device {}: limit {}, peak {}, refused {}\n", group,
                 device, human_size(used.limit), human_size(used.peak), used.rejections);
    }
  }
  // The ledger goes with the group's last member, unless asked to keep it.
  if (!options.keep) ledger.remove_if_unused(path.c_str());
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace tessera::cli
