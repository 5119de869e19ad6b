// Helpers for tests that run real processes: the worker under the hook on the simulated GPU,
// and the tessera command.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "host_record.h"

namespace tessera::test {

using Environment = std::map<std::string, std::string>;

struct Finished {
  int exit_code = -1;  // 128 + signal if killed by one
  std::string out;
  std::string err;
  // The value of a "key=value" line of out; fails the test if absent.
  std::string value(const std::string& key) const;
  std::uint64_t number(const std::string& key) const;
  // The comma-separated numbers of a "key=1,2,3," line.
  std::vector<std::uint64_t> numbers(const std::string& key) const;
  // What the host withheld from the worker that printed this (its host= line).
  HostRecord host() const { return HostRecord(value("host")); }
};

// Runs argv to completion with the current environment plus `extra`.
Finished run(const std::vector<std::string>& argv, const Environment& extra = {});

// A process left running; its stdout is read line by line, stdin closed to end it.
class Running {
 public:
  Running(const std::vector<std::string>& argv, const Environment& extra);
  ~Running();
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;
  std::string read_line();  // blocks until a line (or EOF: "")
  void write_line(const std::string& line);
  void close_stdin();
  void kill_hard();  // SIGKILL
  int wait();        // exit code, 128 + signal if killed
  // The same, or -1 if it has not ended within `timeout`.
  int wait_for(std::chrono::milliseconds timeout);
  Finished finish();  // reads the rest of stdout, then waits (stderr is not captured)
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
  bool waited_ = false;
};

// A private scratch directory, removed at destruction.
class ScratchDirectory {
 public:
  ScratchDirectory();
  ~ScratchDirectory();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The UUID the simulated GPU gives device `index`.
std::string simulated_gpu_uuid(int index);
// NVIDIA's replica IDs for those simulated GPUs: each UUID, then ::0 to ::replicas-1.
std::set<std::string> simulated_replica_ids(const std::vector<int>& gpus, int replicas);
// A text file's content ("" if it cannot be read).
std::string read_text_file(const std::string& path);

// Paths in the build tree.
std::string build_path(const std::string& relative);
std::string worker();   // tests/cuda_worker
std::string tessera();  // bin/tessera

// Environment that runs the worker on a private simulated GPU with the hook preloaded.
Environment hooked(const ScratchDirectory& scratch, const Environment& extra = {});
// Same, without the hook.
Environment unhooked(const ScratchDirectory& scratch, const Environment& extra = {});

// A container as a runtime makes it from a device plugin's answers: their environment and
// mounts, merged (tests/container).
struct ContainerSpec {
  std::map<std::string, std::string> envs;
  struct Mount {
    std::string container, host;
    bool read_only = false;
  };
  std::vector<Mount> mounts;
};
// The argv that runs `command` in that container, its scratch space in `scratch`. Its
// environment is the one the argv is run with, plus the spec's; never LD_PRELOAD.
std::vector<std::string> in_container(const ScratchDirectory& scratch, const ContainerSpec& spec,
                                      const std::vector<std::string>& command);

// The simulated GPUs tests run on unless they ask for others: contexts that cost nothing,
// so the tests' byte arithmetic is exact (the presets' real context costs are tested apart).
inline constexpr const char* kTestDevice = "H100,context=0";
inline constexpr const char* kTestDevices = "H100,context=0;A100,context=0";

inline constexpr std::uint64_t kMiB = 1ull << 20;
inline constexpr std::uint64_t kGiB = 1ull << 30;

}  // namespace tessera::test
