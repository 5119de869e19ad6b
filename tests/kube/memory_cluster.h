// The Kubernetes API held in memory, for tests: nodes, pods and coordination.k8s.io Leases with
// resource versions; lists with the collection's selector; watches that stream every change
// after a version; JSON merge patches refused (409) when they name a version that is not the
// object's; bindings refused (409) for a bound pod or another UID; Lease creation refused (409)
// when one exists, replacement when its version is stale. Decisions that read and write
// objects are unit-tested on it without HTTP; FakeCluster (fake_cluster.h) serves it over HTTP.
// What the kubelet and controllers would do to objects (create a pod, move it to Running) the
// test does through put, patch and remove.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "kube/cluster.h"

namespace tessera::test {

class InMemoryCluster : public kube::Cluster {
 public:
  // Kinds of object: "nodes", "pods", "leases", "resourceslices", "resourceclaims",
  // "deviceclasses". Keys: the name of a cluster-wide object (a node, a ResourceSlice, a
  // DeviceClass); "namespace/name" of the others.
  static std::string key_of(const std::string& kind, const nlohmann::json& object);

  // Adds or replaces an object, as a controller would (a pod gets a UID and creation time
  // where it has none); watchers see it.
  void put(const std::string& kind, nlohmann::json object) EXCLUDES(mutex_);
  void remove(const std::string& kind, const std::string& key) EXCLUDES(mutex_);
  // Applies a merge patch to an object, as a user's kubectl would.
  void patch(const std::string& kind, const std::string& key, const nlohmann::json& patch)
      EXCLUDES(mutex_);
  std::optional<nlohmann::json> get(const std::string& kind, const std::string& key) const
      EXCLUDES(mutex_);
  // Waits until `ready` holds for the object (or it stays false for `timeout`).
  bool wait_for(const std::string& kind, const std::string& key,
                const std::function<bool(const nlohmann::json&)>& ready,
                std::chrono::milliseconds timeout) EXCLUDES(mutex_);
  // The watch events (lines) of `collection` after version `next`, waiting up to `wait` for
  // one; `next` moves past every event looked at.
  std::vector<std::string> events_after(const kube::Collection& collection, std::uint64_t& next,
                                        std::chrono::milliseconds wait) const EXCLUDES(mutex_);
  // Refuses every call that writes with `status` (0: no answer, as a server that is down)
  // until set back to 200.
  void fail_writes_with(long status) EXCLUDES(mutex_);

  kube::ApiResponse get_node(const std::string& name, kube::Deadline deadline) const override;
  kube::ApiResponse patch_node(const std::string& name, const nlohmann::json& patch,
                               kube::Deadline deadline) const override;
  kube::ApiResponse get_pod(const kube::ObjectName& pod, kube::Deadline deadline) const override;
  kube::ApiResponse patch_pod(const kube::ObjectName& pod, const nlohmann::json& patch,
                              kube::Deadline deadline) const override;
  kube::ApiResponse bind_pod(const kube::ObjectName& pod, const std::string& uid,
                             const std::string& node, kube::Deadline deadline) const override;
  kube::ApiResponse list(const kube::Collection& collection,
                         kube::Deadline deadline) const override;
  // Streams events after `version` until on_event returns false or `stop` is set.
  kube::ApiResponse watch(const kube::Collection& collection, const std::string& version,
                          const std::function<bool(const std::string&)>& on_event,
                          const std::atomic<bool>& stop, int idle_seconds) const override;
  kube::ApiResponse get_lease(const kube::ObjectName& lease,
                              kube::Deadline deadline) const override;
  kube::ApiResponse create_lease(const kube::ObjectName& lease, const nlohmann::json& object,
                                 kube::Deadline deadline) const override;
  kube::ApiResponse replace_lease(const kube::ObjectName& lease, const nlohmann::json& object,
                                  kube::Deadline deadline) const override;
  kube::ApiResponse get_resource_claim(const kube::ObjectName& claim,
                                       kube::Deadline deadline) const override;
  kube::ApiResponse list_resource_slices(const std::string& driver, const std::string& node,
                                         kube::Deadline deadline) const override;
  kube::ApiResponse create_resource_slice(const nlohmann::json& object,
                                          kube::Deadline deadline) const override;
  kube::ApiResponse replace_resource_slice(const std::string& name, const nlohmann::json& object,
                                           kube::Deadline deadline) const override;
  kube::ApiResponse delete_resource_slice(const std::string& name,
                                          kube::Deadline deadline) const override;

 private:
  struct Event {
    std::uint64_t version;
    std::string kind, type;
    nlohmann::json object;
  };
  // The API server's state: mutable so that the interface's calls, const to their callers,
  // change it as the API server's would.
  void stamp(nlohmann::json& object) const REQUIRES(mutex_);
  // Deletes an object as the API server does (its DELETED event recorded); false if none.
  bool erase(const std::string& kind, const std::string& key) const REQUIRES(mutex_);
  void record(const std::string& kind, const std::string& type, const nlohmann::json& object) const
      REQUIRES(mutex_);
  kube::ApiResponse read(const std::string& kind, const std::string& key) const EXCLUDES(mutex_);
  kube::ApiResponse merge(const std::string& kind, const std::string& key,
                          nlohmann::json patch) const EXCLUDES(mutex_);
  // Refused (409) if it exists.
  kube::ApiResponse create(const std::string& kind, const std::string& key,
                           const nlohmann::json& object) const EXCLUDES(mutex_);
  // Refused (409) if the object names a version that is not the stored one's.
  kube::ApiResponse replace(const std::string& kind, const std::string& key,
                            const nlohmann::json& object) const EXCLUDES(mutex_);

  mutable base::Mutex mutex_;
  mutable base::CondVar changed_;
  mutable std::uint64_t version_ GUARDED_BY(mutex_) = 100;
  // kind -> key -> object
  mutable std::map<std::string, std::map<std::string, nlohmann::json>> objects_ GUARDED_BY(mutex_);
  mutable std::vector<Event> events_ GUARDED_BY(mutex_);
  long write_status_ GUARDED_BY(mutex_) = 200;
};

}  // namespace tessera::test
