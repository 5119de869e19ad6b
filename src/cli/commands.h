// The tessera subcommands. Each returns the process exit status. A refused argument is
// thrown as UsageError (exit status 2), any other failure as std::runtime_error (status 1),
// each with a message that names the input at fault.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "contract/dra.h"
#include "contract/host_layout.h"
#include "node/nvml.h"
#include "sched/trace_generator.h"

namespace tessera::cli {

struct Installation;

inline constexpr int kUsageStatus = 2;  // refused arguments, as for any Unix command

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RunOptions {
  std::optional<int> device;     // physical GPU index; the group sees only this GPU
  std::string memory;            // a size, as written by the user; empty: no memory limit
  std::optional<int> cores;      // percent of the GPU's time
  bool burst = false;            // may use time no other group wants
  std::string priority;          // "high", "low", or empty: none
  std::optional<int> tolerance;  // with --priority high: latency given up to low, percent
  std::string group;             // empty: a group of its own
  bool keep = false;             // leave the ledger for `tessera top` after the command ends
  bool summary = false;          // print the group's limit, peak and refusals at the end
  std::vector<std::string> command;
};
int run_command(const RunOptions& options);

struct DevicesOptions {
  bool json = false;
};
int devices_command(const DevicesOptions& options);
// The GPUs NVML reports (the simulated NVML's when `simulated`). Throws std::runtime_error.
node::Inventory machine_inventory(const Installation& installation, bool simulated);

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
  bool references = true;   // the offline packer and the bound beside the policies
  bool preemption = false;  // pods that fit nowhere evict lower priorities (by the trace's qos)
  // A mixed MIG cluster: `mig_nodes` of the nodes with `mig_node_gpus` GPUs have their last
  // `mig_gpus` MIG-capable, cut as `mig_layout` at start; `mig_pods` of the pods sharing a GPU
  // ask for a profile instead; with `dynamic_mig` the layouts change for pods that fit nowhere.
  double mig_nodes = 0;
  int mig_node_gpus = 8;
  int mig_gpus = 4;
  std::string mig_model = "A100-40GB";
  std::string mig_layout = "3g.20gb=1,2g.10gb=1,1g.5gb=2";  // or "whole": MIG off at start
  double mig_pods = 0;
  bool dynamic_mig = false;
  double recut_seconds = 5, mig_mode_seconds = 30;
};
int sim_command(const SimOptions& options);

struct TraceGenOptions {
  std::string nodes, from, output;
  sched::TraceShape shape;
  std::uint64_t seed = 1;
};
int trace_gen_command(const TraceGenOptions& options);

struct SchedulerOptions {
  std::string listen = "127.0.0.1:8888";
  std::string url_prefix;  // kube-scheduler's urlPrefix path, e.g. /tessera
  std::string api_server;  // empty: the in-cluster service account
  std::string token_file;
  std::string ca_file;
  std::string policy = "fgd-balanced";
  int timeout_ms = 5000;
  std::string tls_cert_file, tls_key_file;  // both: HTTPS
  bool leader_elect = false;
  bool lease_follow = false;
  std::string lease_name = "tessera-scheduler";
  std::string lease_namespace;  // empty: POD_NAMESPACE, else kube-system
  std::string leader_identity;  // empty: POD_NAME, else the host's name
  int lease_duration_s = 15;
  double renew_deadline_s = 10, retry_period_s = 2;  // kube-scheduler's defaults
};
int scheduler_command(const SchedulerOptions& options);

struct NodeOptions {
  std::string node_name;  // empty: NODE_NAME, else the host's name
  std::string device_plugin_dir = contract::kKubeletDevicePluginDirectory;
  std::string config_file;
  std::string config_dir;
  std::string config;  // the config to use when no node label names one
  std::string features_dir;
  std::string state_dir = contract::kDefaultStateDirectory;
  std::string pod_resources_socket = contract::kKubeletPodResourcesSocket;
  std::string metrics_listen;  // HOST:PORT; empty: no metrics
  std::string api_server;      // empty: in-cluster if in a pod, else none
  std::string token_file;
  std::string ca_file;
  double recovery_seconds = 60;
  std::string replica_policy = "distributed";
  std::string mps_control;  // empty: nvidia-cuda-mps-control on PATH (the simulated one beside
                            // the simulated GPU)
  std::string nvidia_smi;   // empty: nvidia-smi on PATH (likewise)
  // DRA instead of device plugins (dra/node_plugin.h).
  bool dra = false;
  std::string plugins_registry_dir = contract::kKubeletPluginsRegistry;
  std::string plugins_dir = contract::kKubeletPluginsDirectory;
  std::string cdi_dir = contract::kCdiDirectory;
};
int node_command(const NodeOptions& options);

struct SimGpuEventOptions {
  int device = -1;
  std::optional<std::uint64_t> xid;
  std::string ecc;  // single or double
};
int simgpu_event_command(const SimGpuEventOptions& options);

// tessera mig show|plan|apply|advise.
inline constexpr int kResetNeededStatus = 3;  // apply: a MIG mode change waits for a GPU reset
struct MigOptions {
  std::string action;
  std::string config_file;        // mig-parted's config (v1)
  std::string config;             // which of its configs
  std::string model;              // plan offline for this GPU model; advise for it
  std::vector<int> devices;       // GPUs to act on (default: all)
  bool force = false;             // destroy GPU instances in use
  std::vector<std::string> jobs;  // advise: COUNTxMEMORY[@COMPUTE_SLICES]
  std::string pods;               // advise: a pod list (JSON), each pod's GPU asks as jobs
  int gpus = 1;                   // advise: how many GPUs
};
int mig_command(const MigOptions& options);

// tessera simgpu reset: as nvidia-smi -r, applies a pending MIG mode; refused while in use.
int simgpu_reset_command(int device);

// HOST:PORT with PORT from 0 to 65535; throws UsageError naming `option` otherwise.
void split_listen_address(const std::string& text, const char* option, std::string& host,
                          int& port);

}  // namespace tessera::cli
