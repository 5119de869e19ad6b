// Fractional GPUs at Allocate: which pod a slice request belongs to, the limits its container
// gets, and the per-container ledger the hook enforces them through.
//
// The kubelet's Allocate names only device IDs. The pod is found through the API server: the
// pending pod on this node whose tessera.io/assignment (written by tessera scheduler) names this
// node, with a container asking for as many devices, not yet given its slice; among several,
// the one assigned first. It is claimed with an annotation (tessera.io/allocated) written on
// the version read, so two requests never take one pod. Without an API server, or without an
// assignment, the slice's defaults from the config apply.
//
// The container gets the hook as /etc/ld.so.preload plus the library, its ledger directory,
// its limits in Tessera's and HAMi's variables, and NVIDIA_VISIBLE_DEVICES of its GPU(s).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kube/api_client.h"
#include "node/allocation.h"
#include "node/config.h"
#include "node/health.h"
#include "node/nvml.h"
#include "node/resources.h"

namespace tessera::node {

// Where things are on the host (paths the kubelet mounts into containers).
struct SliceFiles {
  std::string hook_library;  // libtessera-cuda.so
  std::string preload_file;  // holds the hook's path inside the container
  std::string ledger_root;   // one directory per container below it
};

// Paths inside the container.
inline constexpr const char* kContainerHookPath = "/usr/local/lib/tessera/libtessera-cuda.so";
inline constexpr const char* kContainerLedgerDir = "/var/run/tessera";
inline constexpr const char* kContainerLedgerFile = "/var/run/tessera/group.ledger";
inline constexpr const char* kAllocatedAnnotation = "tessera.io/allocated";

// The limits a container gets on each of its GPUs.
struct SliceGrant {
  std::vector<int> gpus;                    // inventory indices; the container's 0, 1, ...
  std::vector<std::uint64_t> memory_bytes;  // per GPU; kUnlimited for none
  std::vector<int> cores;                   // per GPU; 0 for none
  std::string pod_namespace, pod_name, pod_uid, container;  // empty: the slice's defaults
  std::string source;                                       // for the log
};

class SliceAllocator {
 public:
  using Reporter = std::function<void(const std::string&)>;
  // `api` may be null: no cluster, the defaults always.
  SliceAllocator(const kube::ApiClient* api, std::string node_name, SliceFiles files,
                 Reporter report);

  // The container's allocation for `ids` of a slice resource. Throws AllocationError.
  ContainerAllocation allocate(const Inventory& inventory, const PluginConfig& config,
                               const Resource& resource, const std::vector<std::string>& ids,
                               const HealthBoard& health);

  // Gives a container the hook, a new ledger holding `grant` across all its processes, and
  // the limits in Tessera's and HAMi's variables. Returns the limits, as the log says them.
  // Throws AllocationError.
  std::string add_ledger(ContainerAllocation& allocation, const SliceGrant& grant) const;

  // What `allocate` decides, without creating anything (exposed for tests).
  SliceGrant grant_for(const Inventory& inventory, const Resource& resource,
                       const std::vector<std::string>& ids);

  // Creates the files the containers need (the preload file); throws std::runtime_error.
  void prepare() const;
  // Removes ledger directories of pods no longer on this node with no live member, given the
  // UIDs of the pods that are, and forgets their claims. Returns how many went.
  int collect(const std::set<std::string>& live_pod_uids);

 private:
  SliceGrant defaults(const Inventory& inventory, const Resource& resource,
                      const std::vector<std::string>& ids) const;
  bool claim_pod(const Inventory& inventory, const Resource& resource, int devices,
                 SliceGrant& grant);
  std::string make_ledger(const SliceGrant& grant) const;

  const kube::ApiClient* api_;
  std::string node_name_;
  SliceFiles files_;
  Reporter report_;
  std::mutex claim_mutex_;         // one claim at a time: two never pick one pod
  std::set<std::string> claimed_;  // "<uid>/<container>" given a slice by this agent
};

}  // namespace tessera::node
