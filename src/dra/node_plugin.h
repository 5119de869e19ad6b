// Tessera as a DRA driver on one node (`tessera node --dra`): beside the node agent, which
// reads the GPUs, watches their health and keeps the hook, the coordination files and the
// config, this publishes the node's ResourceSlices and serves the kubelet's DRA plugin API.
//
// A node hands out its GPUs one way: with --dra the agent serves no device plugin (agent.h,
// serve_device_plugins), since two allocators of one GPU cannot see each other's grants.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "base/log.h"
#include "contract/dra.h"
#include "dra/driver.h"
#include "dra/plugin_server.h"
#include "dra/slice_publisher.h"
#include "kube/cluster.h"
#include "node/agent.h"

namespace tessera::dra {

struct DraPluginOptions {
  std::string driver = contract::kDraDriverName;
  std::string registry_dir = contract::kKubeletPluginsRegistry;
  std::string plugins_dir = contract::kKubeletPluginsDirectory;
  std::string cdi_dir = contract::kCdiDirectory;
  std::string node_name;
  std::string state_dir;  // the agent's (contract/host_layout.h)
};

class DraNodePlugin {
 public:
  // `agent` is started, and outlives this; so does `cluster`.
  DraNodePlugin(DraPluginOptions options, node::NodeAgent& agent, const kube::Cluster& cluster,
                base::Reporter report);
  ~DraNodePlugin();
  DraNodePlugin(const DraNodePlugin&) = delete;
  DraNodePlugin& operator=(const DraNodePlugin&) = delete;

  // Restores the checkpoints, serves the plugin, and keeps the slices current (the first
  // publication is tried before this returns; a failure is retried). Throws
  // std::runtime_error when the plugin cannot be served.
  void start();
  void stop();
  DraDriver& driver() { return *driver_; }
  // The plugin's metrics, in Prometheus' text format (served beside the agent's). After start().
  std::string metrics() const;

 private:
  void publish_loop();
  GpuHealth gpu_health() const;

  DraPluginOptions options_;
  node::NodeAgent& agent_;
  const kube::Cluster& cluster_;
  base::Reporter report_;
  std::unique_ptr<DraDriver> driver_;
  std::unique_ptr<DraPluginServer> server_;
  SlicePublisher publisher_;                 // the publish thread's alone
  std::atomic<std::int64_t> generation_{0};  // the publisher's, for the metrics
  std::atomic<bool> stopping_{false};
  std::thread publisher_thread_;
};

}  // namespace tessera::dra
