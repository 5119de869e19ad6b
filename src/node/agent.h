// tessera node: the node agent. It reads the GPUs (NVML) and the config, serves one device
// plugin per resource to the kubelet, watches the GPUs' health, and tells the cluster what
// the node has (labels, the tessera.io/gpus annotation, a features file for NFD).
//
// Live: an edited or replaced config file, or a changed nvidia.com/device-plugin.config label,
// is read, checked and applied without a restart. Only resources that appear or go are
// registered or unregistered; a resource whose devices changed sends its new list to the
// kubelet; the rest are untouched. A refused config is logged and shown on the node
// (tessera.io/config-error) while the last good one keeps serving. Allocate keeps answering
// throughout: it reads a snapshot of the config in force.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "base/mutex.h"
#include "contract/host_layout.h"
#include "kube/cluster.h"
#include "node/allocation.h"
#include "node/config.h"
#include "node/container_grants.h"
#include "node/health.h"
#include "node/labels.h"
#include "node/metrics.h"
#include "node/mig_layout.h"
#include "node/mps.h"
#include "node/nvml.h"
#include "node/plugin_server.h"
#include "node/resources.h"

namespace tessera::node {

struct NodeAgentOptions {
  std::string node_name;
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string device_plugin_dir = contract::kKubeletDevicePluginDirectory;
  std::string config_file;   // one config (named after --config, or "default")
  std::string config_dir;    // named configs, a file each (a mounted ConfigMap)
  std::string config_name;   // the config to use when no node label names one
  std::string features_dir;  // empty: no features file
  std::string state_dir =
      contract::kDefaultStateDirectory;  // laid out as contract/host_layout.h says
  std::string hook_library;              // installed into state_dir for containers with slices
  // The kubelet's pod-resources API: whose devices a container's are (container_grants.h).
  std::string pod_resources_socket = contract::kKubeletPodResourcesSocket;
  std::string mps_control = "nvidia-cuda-mps-control";  // run for sharing.mps (PATH if no '/')
  std::string nvidia_smi = "nvidia-smi";  // run for flags.computeTimeslice (PATH if no '/')
  std::chrono::milliseconds mps_check_every{1000};
  std::chrono::milliseconds recovery_quiet{60000};
  ReplicaPolicy replica_policy = ReplicaPolicy::distributed;
  // False where the GPUs are handed out through DRA instead (dra/node_plugin.h): one node, one
  // way of allocating its GPUs.
  bool serve_device_plugins = true;
  std::unique_ptr<kube::Cluster> cluster;  // null: no cluster
  base::Reporter report;                   // the log; never throws
};

class NodeAgent {
 public:
  explicit NodeAgent(NodeAgentOptions options);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Reads the GPUs and the config, serves and registers the plugins, starts watching.
  // Throws (ConfigError, std::runtime_error) when no config can be served at all.
  void start();
  void stop();

  // Reads the configs again now; false (the last good config kept) if refused.
  bool reload();
  std::uint64_t config_generation() const;
  std::string config_error() const;  // why the last config read was refused, or ""
  std::string metrics();
  // The GPUs as read at start (the DRA plugin's: in DRA mode the agent changes no layout).
  const Inventory& inventory() const { return inventory_; }
  // What a DRA plugin beside the agent shares with it (dra/node_plugin.h); valid after start().
  const HealthBoard& health() const { return health_; }
  ContainerGrants& grants() { return *grants_; }
  const ChangeSignal& changes() const { return changes_; }
  PluginConfig served_config() const;

  // What each resource's plugin answers the kubelet (the gRPC servers call these; so may
  // anyone, from any thread).
  std::vector<PluginDevice> devices_of(const std::string& resource) const;
  // Throws AllocationError with the reason the kubelet shows.
  ContainerAllocation allocate(const std::string& resource, const std::vector<std::string>& ids);

 private:
  // What is served, as one snapshot: the GPUs as last read (a MIG re-cut changes their
  // devices), the config, and the resources built from both.
  struct Served {
    std::shared_ptr<const Inventory> inventory;
    PluginConfig config;
    ResourceMap map;
  };
  std::shared_ptr<const Served> served() const EXCLUDES(state_mutex_);
  void apply(std::shared_ptr<const Served> next) REQUIRES(reload_mutex_) EXCLUDES(servers_mutex_);
  std::unique_ptr<DevicePluginServer> make_server(const std::string& resource);
  ConfigSet read_configs() const;
  void restart_health(const Served& next) REQUIRES(reload_mutex_);
  void register_all(bool restart_servers) EXCLUDES(servers_mutex_);
  void watch_kubelet();
  void watch_config();
  // agent_cluster.cpp: the node's config label; what the agent publishes on the node.
  std::string read_node_label();
  void watch_node();
  // agent_mig.cpp: the tessera.io/mig-layout annotation applied, and the GPUs served anew.
  void apply_wanted_mig_layout(const std::string& text) EXCLUDES(reload_mutex_);
  // The GPU instances the kubelet has given to containers, by the served devices' IDs.
  HeldInstances held_mig_instances(const Served& state) const;
  void publish_loop();
  void request_publish();
  void say(const std::string& text) const;
  // The scheduler's numbering of this node's GPUs, as the served config has them.
  std::vector<std::string> scheduler_numbering(const Served& state) const;

  NodeAgentOptions options_;
  std::unique_ptr<Nvml> nvml_;
  Inventory inventory_;
  HealthBoard health_;
  ChangeSignal changes_;
  std::unique_ptr<ContainerGrants> grants_;
  MetricsRenderer metrics_renderer_;

  // One reload at a time: it owns what applying a config changes beside the served state.
  // Taken before the locks below when both are held.
  base::Mutex reload_mutex_;
  std::unique_ptr<HealthMonitor> monitor_ GUARDED_BY(reload_mutex_);
  std::unique_ptr<MpsSupervisor> mps_ GUARDED_BY(reload_mutex_);
  // The time slice last set on the GPUs; -1: never.
  int applied_timeslice_ GUARDED_BY(reload_mutex_) = -1;
  HealthSettings monitor_settings_ GUARDED_BY(reload_mutex_);
  std::shared_ptr<const Inventory> monitor_inventory_ GUARDED_BY(reload_mutex_);

  mutable base::Mutex state_mutex_ ACQUIRED_AFTER(reload_mutex_);
  std::shared_ptr<const Served> served_ GUARDED_BY(state_mutex_);
  std::string node_label_ GUARDED_BY(state_mutex_);
  std::string mig_layout_ GUARDED_BY(state_mutex_);        // the annotation last acted on
  std::string mig_layout_state_ GUARDED_BY(state_mutex_);  // what came of it, for the node
  std::string config_error_ GUARDED_BY(state_mutex_);
  std::uint64_t generation_ GUARDED_BY(state_mutex_) = 0;
  std::uint64_t reload_errors_ GUARDED_BY(state_mutex_) = 0;

  base::Mutex servers_mutex_ ACQUIRED_AFTER(reload_mutex_);
  std::map<std::string, std::unique_ptr<DevicePluginServer>> servers_ GUARDED_BY(servers_mutex_);
  // Resources the kubelet has not taken yet.
  std::vector<std::string> unregistered_ GUARDED_BY(servers_mutex_);

  std::atomic<bool> stopping_{false};
  base::Mutex publish_mutex_;
  base::CondVar publish_wanted_;
  bool publish_pending_ GUARDED_BY(publish_mutex_) = false;
  std::vector<std::thread> threads_;
  std::map<std::string, std::string> published_labels_;  // publisher thread only
};

}  // namespace tessera::node
