// The tessera subcommands. Each returns the process exit status. A refused argument is
// thrown as UsageError (exit status 2), any other failure as std::runtime_error (status 1),
// each with a message that names the input at fault.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera::cli {

inline constexpr int kUsageStatus = 2;  // refused arguments, as for any Unix command

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RunOptions {
  std::optional<int> device;  // physical GPU index; the group sees only this GPU
  std::string memory;         // a size, as written by the user; empty: no memory limit
  std::optional<int> cores;   // percent of the GPU's time
  bool burst = false;         // may use time no other group wants
  std::string priority;       // "high", "low", or empty: none
  std::string group;          // empty: a group of its own
  bool keep = false;          // leave the ledger for `tessera top` after the command ends
  bool summary = false;       // print the group's limit, peak and refusals at the end
  std::vector<std::string> command;
};
int run_command(const RunOptions& options);

struct DevicesOptions {
  bool json = false;
};
int devices_command(const DevicesOptions& options);

struct TopOptions {
  bool once = false;
  bool json = false;
  double interval_seconds = 1.0;
};
int top_command(const TopOptions& options);

struct SimOptions {
  std::string nodes;
  std::string pods;
  std::string policies = "all";
  std::string seeds = "42";
  double load = 1.3;
  int threads = 2;
  bool replay = false;  // the trace's own creation and deletion times instead of sampling
  std::string workload = "trace-then-sample";  // or "sample"
  std::string output;                          // directory for curve.csv and allocation.svg
};
int sim_command(const SimOptions& options);

struct SchedulerOptions {
  std::string listen = "127.0.0.1:8888";
  std::string url_prefix;  // kube-scheduler's urlPrefix path, e.g. /tessera
  std::string api_server;  // empty: the in-cluster service account
  std::string token_file;
  std::string ca_file;
  std::string policy = "fgd-packed";
  int timeout_ms = 5000;
};
int scheduler_command(const SchedulerOptions& options);

}  // namespace tessera::cli
