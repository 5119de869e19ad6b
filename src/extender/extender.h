// The kube-scheduler extender: filter, prioritize and bind over HTTP (docs/scheduler.md),
// deciding with the placement engine. Node capacity comes from the nodes kube-scheduler sends
// (or, with nodeCacheCapable, from the nodes on the API server); what is already allocated
// comes from the pods on the API server (their tessera.io/assignment annotations) and from
// this extender's own binds. Both are listed, then watched (follow), as client-go's reflectors
// do, and every event updates the allocation state in place.
//
// Requests may arrive concurrently: filter and prioritize read the state together, events and
// binds change it one at a time. Everything read from outside is checked; a pod or node that
// cannot be read is reported and skipped, never the whole list, and a bound pod whose record
// cannot be read is held conservatively where it runs.
//
// The state and its decisions are ClusterState (cluster_state.h), the JSON of requests and of
// pods wire.h; this class is the verbs, the bind sequence and the lists and watches.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "base/log.h"
#include "base/mutex.h"
#include "extender/cluster_objects.h"
#include "extender/cluster_state.h"
#include "extender/metrics.h"
#include "extender/wire.h"
#include "kube/cluster.h"
#include "kube/reflector.h"
#include "sched/engine.h"

namespace tessera::extender {

struct ExtenderLimits {
  int most_concurrent_binds = 16;                // more are refused at once
  std::chrono::milliseconds bind_budget{20000};  // all API calls of one bind together
};

class Extender {
 public:
  // `report` hears of objects that could not be read (never throws; may be empty).
  Extender(Policy default_policy, std::unique_ptr<kube::Cluster> cluster,
           base::Reporter report = {}, ExtenderLimits limits = {});

  HttpReply filter(const std::string& body);
  HttpReply prioritize(const std::string& body);
  HttpReply bind(const std::string& body);
  // kube-scheduler's preempt verb: for each node it offers, the pods Tessera would evict there
  // (ClusterState::preemption_victims); nodes where no eviction makes room are left out.
  HttpReply preempt(const std::string& body);
  // Prometheus text: the verbs' counts and latencies, bind failures, the state's size.
  std::string metrics();

  // With several replicas, only the leader binds: `leading` says whether this replica leads
  // now (kube::LeaderElector::leading). Without it, this extender always binds.
  void bind_only_while(std::function<bool()> leading);

  // Lists nodes and pods from the API server and rebuilds the allocation state from the
  // pods' assignments. A failure (state kept) if the API server could not be read.
  base::Status sync();

  enum class Resource { nodes, pods };
  // Keeps the state of `resource` current until `stop` (kube::follow_collection); failures
  // are passed to `report`. Never throws.
  void follow(Resource resource, const std::atomic<bool>& stop, const base::Reporter& report);
  // Applies one line of a watch of `resource` (what follow does with each); says whether the
  // watch must end, and if it broke, why. `version` follows the events' resourceVersion.
  kube::WatchEnd apply_event(Resource resource, const std::string& line, std::string& version,
                             std::string& why);

 private:
  // What the lists and watches of nodes and pods do to the state.
  kube::CollectionHandlers handlers(Resource resource);
  void replace_nodes(const nlohmann::json& items) EXCLUDES(mutex_);
  void replace_pods(const nlohmann::json& items) EXCLUDES(mutex_);
  void apply_node_event(std::string_view type, const nlohmann::json& object) EXCLUDES(mutex_);
  void apply_pod_event(std::string_view type, const nlohmann::json& object) EXCLUDES(mutex_);

  // Answers a verb's request, counted and timed in metrics_.
  HttpReply measured(Verb verb, const std::string& body,
                     HttpReply (Extender::*answer)(const std::string&));
  HttpReply answer_filter(const std::string& body) EXCLUDES(mutex_);
  HttpReply answer_prioritize(const std::string& body) EXCLUDES(mutex_);
  HttpReply answer_bind(const std::string& body) EXCLUDES(mutex_);
  HttpReply answer_preempt(const std::string& body) EXCLUDES(mutex_);
  // Parses ExtenderArgs, taking in the nodes kube-scheduler sent where they are newer than the
  // state's; on failure fills reply with 400 and the reason.
  bool parse_args(const std::string& body, Candidates& candidates, HttpReply& reply)
      EXCLUDES(mutex_);
  Policy policy_for(const PodRequest& pod) const;
  void say(const std::string& problem) const;
  // Dynamic MIG: writes the node's tessera.io/mig-layout for `recut` unless the same was asked
  // within kRecutPatience (the node agent is applying it, or refused it: its state says which).
  // Whether the annotation asks for it now.
  bool ask_for_recut(const MigRecut& recut) EXCLUDES(recuts_mutex_);
  static constexpr std::chrono::seconds kRecutPatience{30};

  Policy default_policy_;
  std::unique_ptr<kube::Cluster> cluster_;
  base::Reporter report_;
  ExtenderLimits limits_;
  std::atomic<int> binds_in_flight_{0};
  std::function<bool()> leading_;  // set before serving; empty: always leads
  ExtenderMetrics metrics_;

  base::SharedMutex mutex_;  // verbs read the state; binds and watch events change it
  ClusterState state_ GUARDED_BY(mutex_);
  base::Mutex recuts_mutex_;
  // By node: the layout annotation last written, and when.
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> recuts_
      GUARDED_BY(recuts_mutex_);
};

}  // namespace tessera::extender
