// The node agent's Prometheus metrics (text format 0.0.4). Names follow Prometheus' and
// node-exporter's conventions (tessera_ prefix, base units, _total counters); GPU series
// carry dcgm-exporter's labels (gpu, UUID, modelName, Hostname) and container groups
// Kubernetes' (namespace, pod, container), so dashboards built for those join with these.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "base/mutex.h"
#include "contract/host_layout.h"
#include "node/health.h"
#include "node/nvml.h"

namespace tessera::node {

struct AgentStatus {
  std::string hostname;
  const Inventory* inventory = nullptr;
  const HealthBoard* health = nullptr;
  std::map<std::uint64_t, std::uint64_t> xids;  // events seen, by XID
  struct Served {
    std::uint64_t allocations = 0, refusals = 0;
    std::size_t devices = 0, healthy = 0;
  };
  std::map<std::string, Served> resources;  // by resource name
  std::uint64_t config_generation = 0;
  std::uint64_t reload_errors = 0;
  std::uint64_t assignments_rewritten = 0;  // containers given another GPU than assigned
  std::string config_name;
  bool config_refused = false;  // the last config read was refused; the previous one serves
};

// Renders the metrics; reads the containers' owner records and ledgers in the state directory. The
// achieved compute share of a group is measured between two renders (the first shows none).
class MetricsRenderer {
 public:
  explicit MetricsRenderer(contract::StateLayout layout) : layout_(std::move(layout)) {}
  std::string render(const AgentStatus& status);

 private:
  contract::StateLayout layout_;
  struct Sample {
    std::uint64_t device_time_ns = 0, at_ns = 0;
  };
  base::Mutex mutex_;  // two scrapes at once measure against one previous sample
  std::map<std::string, Sample> previous_ GUARDED_BY(mutex_);  // by group directory and device
};

}  // namespace tessera::node
