// The kube-scheduler extender: filter, prioritize and bind over HTTP (REFERENCE §4), deciding
// with the placement engine. Node capacity comes from the nodes kube-scheduler sends (or, with
// nodeCacheCapable, from the last listing); what is already allocated comes from the
// tessera.io/assignment annotations of the pods on the API server, re-listed every few
// seconds, and from this extender's own binds. Requests may arrive concurrently.
#pragma once

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
  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, int> index_;
  bool dirty_ = true;
  std::mt19937_64 random_{42};
};

}  // namespace tessera::sched
