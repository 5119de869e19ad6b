// An API server for tests that run Tessera's programs: the objects of an InMemoryCluster
// (memory_cluster.h) served over real HTTP on loopback, at the paths and with the answers of
// the Kubernetes API (lists with field selectors, chunked watches, merge patches, bindings,
// Leases, and DRA's ResourceSlices, ResourceClaims and DeviceClasses). The test changes objects
// through InMemoryCluster's methods; programs see the changes through their lists and watches.
#pragma once

#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "memory_cluster.h"

namespace tessera::test {

class FakeCluster : public InMemoryCluster {
 public:
  FakeCluster();
  ~FakeCluster() override;
  FakeCluster(const FakeCluster&) = delete;
  FakeCluster& operator=(const FakeCluster&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void serve_collection(kube::Collection::Kind kind, const httplib::Request& request,
                        httplib::Response& response);
  void serve_leases();
  // resource.k8s.io/v1: ResourceSlices, ResourceClaims and DeviceClasses.
  void serve_resources();

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
};

// A pod asking for GPUs as a user writes it: limits per container, HAMi's resources beside.
nlohmann::json gpu_pod(const std::string& name, int gpus, int gpumem_mib = 0, int gpucores = 0,
                       const std::string& scheduler = "tessera");
// A node with CPU and memory allocatable, as the kubelet reports it.
nlohmann::json cluster_node(const std::string& name, const std::string& cpu = "32",
                            const std::string& memory = "256Gi");

}  // namespace tessera::test
