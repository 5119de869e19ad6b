// Helpers for tests of tessera node as the kubelet meets it: the agent as a process on a private
// simulated machine, driven by the test kubelet (tests/kubelet); tessera scheduler as a process
// placing pods through the fake API server; and the containers the kubelet would start from the
// agent's answers (tests/container).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "fake_cluster.h"
#include "support.h"
#include "test_kubelet.h"

namespace tessera::test {

inline constexpr const char* kTwoGpus = "H100,context=0,numa=0;H100,context=0,numa=1";

// A file of examples/node-configs.
std::string example(const std::string& name);
// Replaces a file at once, as kubectl's ConfigMap update or an editor's save does.
void write_config(const std::string& path, const std::string& text);
// The environment of a private simulated machine of `devices` (workers run unhooked).
Environment machine(const ScratchDirectory& scratch, const std::string& devices = kTwoGpus,
                    const Environment& extra = {});

// A tessera node process on a private simulated machine (node `name`); its log goes to a file.
// The kubelet's directories are the test kubelet's defaults under the scratch directory.
class NodeProcess {
 public:
  NodeProcess(const ScratchDirectory& scratch, const std::vector<std::string>& extra,
              const Environment& environment, const std::string& name = "gpu-node");
  // A clean stop is part of every test: a sanitizer's report in the agent exits otherwise.
  ~NodeProcess();
  bool started() const { return started_; }
  std::string log() const;
  // Stops it as the kubelet's SIGTERM does; its exit status. A stop that takes longer than
  // 20 s is a hang: killed, and the test fails saying so.
  int stop();
  // SIGKILL, as an OOM kill or a node's crash ends it: nothing of its own runs.
  void kill_hard();
  std::string metrics() const;
  // The value of one sample (its name and labels as written), or -1.
  double metric(const std::string& sample) const;

 private:
  std::string log_;
  std::unique_ptr<Running> process_;
  bool started_ = false, stopped_ = false;
  int status_ = -1;
  int metrics_port_ = 0;
};

// tessera scheduler, as kube-scheduler calls it: filter, prioritize, then bind.
class SchedulerProcess {
 public:
  SchedulerProcess(const FakeCluster& cluster, const Environment& environment);
  // Places the pod (as the cluster holds it) on one of `nodes`; the node bound, or "" with the
  // reason in `why`.
  std::string schedule(const nlohmann::json& pod, const std::vector<std::string>& nodes,
                       std::string& why);

 private:
  std::unique_ptr<Running> process_;
  int port_ = 0;
};

std::set<std::string> ids_of(const TestKubelet::Devices& devices);
// Whether the devices listed are exactly `wanted`.
std::function<bool(const TestKubelet::Devices&)> has_ids(const std::set<std::string>& wanted);

// The pod as the kubelet admits it, from its object: each container's device-plugin resources
// (every limit but the node's own, CPU and memory, and the resources no node advertises).
TestKubelet::PodSpec kubelet_pod(const nlohmann::json& pod);
// The container the runtime starts from the plugins' answers.
ContainerSpec container_spec(const TestKubelet::AdmittedContainer& container);

}  // namespace tessera::test
