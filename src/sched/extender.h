// The kube-scheduler extender: filter, prioritize and bind over HTTP (REFERENCE §4), deciding
// with the placement engine. Node capacity comes from the nodes kube-scheduler sends (or, with
// nodeCacheCapable, from the nodes on the API server); what is already allocated comes from
// the tessera.io/assignment annotations of the pods on the API server, and from this
// extender's own binds. Both are listed, then watched (follow), as client-go's reflectors do.
// Requests may arrive concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>

#include "sched/api_client.h"
#include "sched/engine.h"
#include "sched/kube.h"

namespace tessera::sched {

struct HttpReply {
  int status = 200;
  std::string body;
};

class Extender {
 public:
  Extender(Policy default_policy, std::unique_ptr<ApiClient> api);

  HttpReply filter(const std::string& body);
  HttpReply prioritize(const std::string& body);
  HttpReply bind(const std::string& body);

  // Lists nodes and pods from the API server and rebuilds the allocation state from the
  // pods' assignments. False (state kept) if the API server could not be read.
  bool sync(std::string& error);

  enum class Resource { nodes, pods };
  // Keeps the state of `resource` current until `stop`: lists it, then watches from the
  // list's version, applying each change; lists again when the watch breaks or its version
  // has expired (410 Gone). Failures are passed to `report` and retried a second later.
  void follow(Resource resource, const std::atomic<bool>& stop,
              const std::function<void(const std::string&)>& report);

 private:
  struct Assignment {
    std::string node;
    kube::PodRequest pod;
    std::vector<int> gpus;
  };
  struct Candidates {
    kube::PodRequest pod;
    std::vector<nlohmann::json> node_objects;  // when kube-scheduler sent whole nodes
    std::vector<std::string> names;
    bool names_only = false;
  };

  enum class WatchEnd { not_yet, expired, broken };
  bool list(Resource resource, std::string& version, std::string& error);
  // Applies one line of a watch; says whether the watch must end, and if it broke, why.
  WatchEnd apply_event(Resource resource, const std::string& line, std::string& version,
                       std::string& why);

  // Parses ExtenderArgs; on failure fills reply with 400 and the reason.
  bool parse_args(const std::string& body, Candidates& candidates, HttpReply& reply);
  void rebuild_locked();
  // Why the pod cannot go to node (empty if it can); fills request for it.
  std::string refusal_locked(const kube::PodRequest& pod, const std::string& node, Request& request,
                             int& index);
  Policy policy_for(const kube::PodRequest& pod) const;

  Policy default_policy_;
  std::unique_ptr<ApiClient> api_;
  std::mutex mutex_;
  std::map<std::string, kube::NodeInfo> nodes_;
  std::map<std::string, Assignment> assignments_;  // by pod UID
  std::map<std::string, kube::PodRequest> seen_;   // pods filtered, by UID, for bind
  // This extender's binds, by pod UID, and when: held across a list read before they landed.
  std::map<std::string, std::chrono::steady_clock::time_point> own_binds_;
  static constexpr std::chrono::seconds kOwnBindGrace{60};
  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, int> index_;
  bool dirty_ = true;
  std::mt19937_64 random_{42};
};

}  // namespace tessera::sched
