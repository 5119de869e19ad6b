// The Kubernetes API as Tessera uses it: each call names the objects it touches (a node, a
// pod, a Lease, a collection), never a path. ApiCluster (api_cluster.h) calls the API server;
// the tests' InMemoryCluster holds the objects itself, so that decisions that read and write
// objects are tested without HTTP. Answers keep the API server's shape (status, JSON body),
// which the callers read with bounds (json_input.h, objects.h).
#pragma once

#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "kube/api_client.h"

namespace tessera::kube {

// A namespaced object: a pod or a Lease.
struct ObjectName {
  std::string name_space;
  std::string name;
  std::string label() const { return name_space + "/" + name; }
};

// A collection Tessera lists and watches: every node or pod, or just one node, or just the
// pods bound to one node.
struct Collection {
  enum class Kind { nodes, pods };
  Kind kind = Kind::pods;
  std::string node;  // nodes: only the node of that name; pods: only those bound to it

  static Collection all_nodes() { return {Kind::nodes, {}}; }
  static Collection node_named(std::string name) { return {Kind::nodes, std::move(name)}; }
  static Collection all_pods() { return {Kind::pods, {}}; }
  static Collection pods_on_node(std::string name) { return {Kind::pods, std::move(name)}; }
  // For messages: "pods on node gpu-1".
  std::string describe() const;
};

class Cluster {
 public:
  virtual ~Cluster() = default;

  virtual ApiResponse get_node(const std::string& name, Deadline deadline) const = 0;
  // A JSON merge patch of the node (labels and annotations).
  virtual ApiResponse patch_node(const std::string& name, const nlohmann::json& patch,
                                 Deadline deadline) const = 0;

  virtual ApiResponse get_pod(const ObjectName& pod, Deadline deadline) const = 0;
  // A JSON merge patch of the pod; one naming metadata.resourceVersion is refused (409) if the
  // pod changed since that version.
  virtual ApiResponse patch_pod(const ObjectName& pod, const nlohmann::json& patch,
                                Deadline deadline) const = 0;
  // Binds the pod to `node` (a Binding); refused (409) if it is bound already or its UID is
  // not `uid`.
  virtual ApiResponse bind_pod(const ObjectName& pod, const std::string& uid,
                               const std::string& node, Deadline deadline) const = 0;

  // The collection as one list: its items under "items", its version under
  // metadata.resourceVersion.
  virtual ApiResponse list(const Collection& collection, Deadline deadline) const = 0;
  // Streams the collection's changes after `version` (one watch event per line) to on_event
  // until the stream ends, on_event returns false, or `stop` is set; a stream silent for
  // `idle_seconds` is dropped.
  virtual ApiResponse watch(const Collection& collection, const std::string& version,
                            const std::function<bool(const std::string&)>& on_event,
                            const std::atomic<bool>& stop, int idle_seconds) const = 0;

  virtual ApiResponse get_lease(const ObjectName& lease, Deadline deadline) const = 0;
  // Refused (409) if it exists.
  virtual ApiResponse create_lease(const ObjectName& lease, const nlohmann::json& object,
                                   Deadline deadline) const = 0;
  // Refused (409) if the object's metadata.resourceVersion is not the Lease's.
  virtual ApiResponse replace_lease(const ObjectName& lease, const nlohmann::json& object,
                                    Deadline deadline) const = 0;

  // Dynamic Resource Allocation (resource.k8s.io/v1).
  virtual ApiResponse get_resource_claim(const ObjectName& claim, Deadline deadline) const = 0;
  // The ResourceSlices `driver` publishes for `node`, as one list.
  virtual ApiResponse list_resource_slices(const std::string& driver, const std::string& node,
                                           Deadline deadline) const = 0;
  // Refused (409) if one of its name exists.
  virtual ApiResponse create_resource_slice(const nlohmann::json& object,
                                            Deadline deadline) const = 0;
  // Refused (409) if the object's metadata.resourceVersion is set and not the slice's.
  virtual ApiResponse replace_resource_slice(const std::string& name, const nlohmann::json& object,
                                             Deadline deadline) const = 0;
  virtual ApiResponse delete_resource_slice(const std::string& name, Deadline deadline) const = 0;
};

}  // namespace tessera::kube
