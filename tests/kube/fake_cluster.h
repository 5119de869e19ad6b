// An API server for tests that holds state: nodes and pods with resource versions, lists
// with field selectors, watches that stream every change from a version on, JSON merge
// patches (refused with 409 when they name a version that is not the object's), and pod
// bindings, and coordination.k8s.io Leases. Real HTTP on loopback; what the kubelet and controllers
// would do to objects (create a pod, move it to Running) the test does through the methods below.
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tessera::test {

class FakeCluster {
 public:
  FakeCluster();
  ~FakeCluster();
  FakeCluster(const FakeCluster&) = delete;
  FakeCluster& operator=(const FakeCluster&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Adds or replaces an object (kind "nodes", "pods" or "leases"), as a controller would; watchers
  // see it.
  void put(const std::string& kind, nlohmann::json object);
  void remove(const std::string& kind, const std::string& key);
  // Applies a merge patch to an object, as a user's kubectl would.
  void patch(const std::string& kind, const std::string& key, const nlohmann::json& patch);
  std::optional<nlohmann::json> get(const std::string& kind, const std::string& key) const;
  // Waits until `ready` holds for the object (or it stays false for `timeout`).
  bool wait_for(const std::string& kind, const std::string& key,
                const std::function<bool(const nlohmann::json&)>& ready,
                std::chrono::milliseconds timeout);
  // Requests served, as "METHOD path".
  std::vector<std::string> requests() const;

  // Keys: a node's name; a pod's "namespace/name".
  static std::string key_of(const std::string& kind, const nlohmann::json& object);

 private:
  struct Event {
    std::uint64_t version;
    std::string kind, type;
    nlohmann::json object;
  };
  void record(const std::string& kind, const std::string& type, const nlohmann::json& object);
  void stamp(nlohmann::json& object);
  void serve_collection(const std::string& kind, const httplib::Request& request,
                        httplib::Response& response);
  void serve_leases();
  void serve_patch(const std::string& kind, const std::string& key, const httplib::Request& request,
                   httplib::Response& response);

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::atomic<bool> stopping_{false};
  std::uint64_t version_ = 100;
  std::map<std::string, std::map<std::string, nlohmann::json>> objects_;  // kind -> key -> object
  std::vector<Event> events_;
  std::vector<std::string> requests_;
};

// A pod asking for GPUs as a user writes it: limits per container, HAMi's resources beside.
nlohmann::json gpu_pod(const std::string& name, int gpus, int gpumem_mib = 0, int gpucores = 0,
                       const std::string& scheduler = "tessera");
// A node with CPU and memory allocatable, as the kubelet reports it.
nlohmann::json cluster_node(const std::string& name, const std::string& cpu = "32",
                            const std::string& memory = "256Gi");

}  // namespace tessera::test
