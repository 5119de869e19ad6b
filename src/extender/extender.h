// The kube-scheduler extender: filter, prioritize and bind over HTTP (REFERENCE §4), deciding
// with the placement engine. Node capacity comes from the nodes kube-scheduler sends (or, with
// nodeCacheCapable, from the nodes on the API server); what is already allocated comes from
// the pods on the API server (their tessera.io/assignment annotations) and from this
// extender's own binds. Both are listed, then watched (follow), as client-go's reflectors do,
// and every event updates the allocation state in place.
//
// Requests may arrive concurrently: filter and prioritize read the state together, events and
// binds change it one at a time. Everything read from outside is checked; a pod or node that
// cannot be read is reported and skipped, never the whole list, and a bound pod whose record
// cannot be read is held conservatively where it runs.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "base/mutex.h"
#include "extender/cluster_objects.h"
#include "extender/metrics.h"
#include "kube/api_client.h"
#include "kube/reflector.h"
#include "sched/engine.h"

namespace tessera::extender {

using sched::Placement;
using sched::Policy;

struct HttpReply {
  int status = 200;
  std::string body;
};

struct ExtenderLimits {
  int most_concurrent_binds = 16;                // more are refused at once
  std::chrono::milliseconds bind_budget{20000};  // all API calls of one bind together
};

class Extender {
 public:
  using Reporter = kube::Reporter;
  // `report` hears of objects that could not be read (never throws; may be empty).
  Extender(Policy default_policy, std::unique_ptr<kube::ApiClient> api, Reporter report = {},
           ExtenderLimits limits = {});

  HttpReply filter(const std::string& body);
  HttpReply prioritize(const std::string& body);
  HttpReply bind(const std::string& body);
  // Prometheus text: the verbs' counts and latencies, bind failures, the state's size.
  std::string metrics();

  // With several replicas, only the leader binds: `leading` says whether this replica leads
  // now (kube::LeaderElector::leading). Without it, this extender always binds.
  void bind_only_while(std::function<bool()> leading);

  // Lists nodes and pods from the API server and rebuilds the allocation state from the
  // pods' assignments. False (state kept) if the API server could not be read.
  bool sync(std::string& error);

  enum class Resource { nodes, pods };
  // Keeps the state of `resource` current until `stop` (kube::follow_collection); failures
  // are passed to `report`. Never throws.
  void follow(Resource resource, const std::atomic<bool>& stop, const kube::Reporter& report);
  // Applies one line of a watch of `resource` (what follow does with each); says whether the
  // watch must end, and if it broke, why. `version` follows the events' resourceVersion.
  kube::WatchEnd apply_event(Resource resource, const std::string& line, std::string& version,
                             std::string& why);

 private:
  // What a pod holds on a node, and what of it is applied to the cluster model.
  struct Hold {
    std::string node;
    PodRequest pod;
    std::vector<int> gpus;     // as recorded; empty with choose_gpus
    bool choose_gpus = false;  // no usable record: the engine picks GPUs to hold
    bool applied = false;
    Request request;
    Placement placement;
  };
  struct Candidates {
    PodRequest pod;
    std::vector<nlohmann::json> node_objects;  // when kube-scheduler sent whole nodes
    std::vector<std::string> names;
    bool names_only = false;
  };

  // What the lists and watches of nodes and pods do to the state.
  kube::CollectionHandlers handlers(Resource resource);
  void replace_nodes(const nlohmann::json& items);
  void replace_pods(const nlohmann::json& items);
  void apply_node_event(std::string_view type, const nlohmann::json& object);
  void apply_pod_event(std::string_view type, const nlohmann::json& object);
  // What a listed or watched pod holds, if anything; problems go to report_.
  std::optional<Hold> hold_of(const nlohmann::json& pod, const std::string& uid);

  // Answers a verb's request, counted and timed in metrics_.
  HttpReply measured(Verb verb, const std::string& body,
                     HttpReply (Extender::*answer)(const std::string&));
  HttpReply answer_filter(const std::string& body);
  HttpReply answer_prioritize(const std::string& body);
  HttpReply answer_bind(const std::string& body);
  // Parses ExtenderArgs; on failure fills reply with 400 and the reason.
  bool parse_args(const std::string& body, Candidates& candidates, HttpReply& reply);
  // The cluster model from nodes_, with every hold applied: after nodes change or a relist.
  void rebuild_locked() REQUIRES(mutex_);
  void apply_locked(Hold& hold) REQUIRES(mutex_);
  void release_locked(Hold& hold) REQUIRES(mutex_);
  void set_hold_locked(const std::string& uid, std::optional<Hold> hold) REQUIRES(mutex_);
  // FGD's target workload is the pods held now and those waiting for a node: measured after a
  // rebuild, and again whenever their count has moved by a tenth (at least 8) since.
  void measure_workload_locked() REQUIRES(mutex_);
  void measure_workload_if_moved_locked() REQUIRES(mutex_);
  // What a listed or watched pod waiting for a node asks for, if it can be read.
  static std::optional<PodRequest> pending_of(const nlohmann::json& pod);
  void set_pending_locked(const std::string& uid, std::optional<PodRequest> pod) REQUIRES(mutex_);
  // Why the pod cannot go to node (empty if it can); fills request for it.
  std::string refusal_locked(const PodRequest& pod, const std::string& node, Request& request,
                             int& index) const REQUIRES_SHARED(mutex_);
  Policy policy_for(const PodRequest& pod) const;
  void say(const std::string& problem) const;

  Policy default_policy_;
  std::unique_ptr<kube::ApiClient> api_;
  Reporter report_;
  ExtenderLimits limits_;
  std::atomic<int> binds_in_flight_{0};
  std::function<bool()> leading_;  // set before serving; empty: always leads
  ExtenderMetrics metrics_;

  base::SharedMutex mutex_;  // verbs read the cluster model; binds and watch events change it
  std::map<std::string, NodeInfo> nodes_ GUARDED_BY(mutex_);
  std::map<std::string, Hold> holds_ GUARDED_BY(mutex_);  // by pod UID
  // This extender's binds, by pod UID, and when: held across a list read before they landed.
  std::map<std::string, std::chrono::steady_clock::time_point> own_binds_ GUARDED_BY(mutex_);
  static constexpr std::chrono::seconds kOwnBindGrace{60};
  std::unique_ptr<Cluster> cluster_ PT_GUARDED_BY(mutex_) GUARDED_BY(mutex_);
  std::map<std::string, int> index_ GUARDED_BY(mutex_);
  std::mt19937_64 random_ GUARDED_BY(mutex_){42};
  std::map<std::string, PodRequest> pending_ GUARDED_BY(mutex_);  // pods waiting for a node, by UID
  // Holds and pending pods when the workload was last measured.
  std::size_t workload_pods_ GUARDED_BY(mutex_) = 0;
};

}  // namespace tessera::extender
