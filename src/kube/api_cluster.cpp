#include "kube/api_cluster.h"

#include <fmt/core.h>

#include "kube/json_input.h"

namespace tessera::kube {
namespace {

// Percent-encodes everything but unreserved characters (RFC 3986).
std::string escaped(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '.' || c == '_' || c == '~';
    out += plain ? std::string(1, static_cast<char>(c)) : fmt::format("%{:02X}", c);
  }
  return out;
}

std::string node_path(const std::string& name) {
  return "/api/v1/nodes/" + escaped(name);
}
std::string pod_path(const ObjectName& pod) {
  return fmt::format("/api/v1/namespaces/{}/pods/{}", escaped(pod.name_space), escaped(pod.name));
}
std::string leases_path(const std::string& name_space) {
  return fmt::format("/apis/coordination.k8s.io/v1/namespaces/{}/leases", escaped(name_space));
}
std::string lease_path(const ObjectName& lease) {
  return leases_path(lease.name_space) + "/" + escaped(lease.name);
}
constexpr const char* kResourceSlices = "/apis/resource.k8s.io/v1/resourceslices";
std::string claim_path(const ObjectName& claim) {
  return fmt::format("/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}",
                     escaped(claim.name_space), escaped(claim.name));
}
// The collection's path and, where it is one node's, the field selector that narrows it.
struct CollectionPath {
  std::string path, selector;  // selector: "" or "fieldSelector=..."
};
CollectionPath collection_path(const Collection& collection) {
  const bool nodes = collection.kind == Collection::Kind::nodes;
  CollectionPath at{nodes ? "/api/v1/nodes" : "/api/v1/pods", {}};
  if (!collection.node.empty()) {
    at.selector = std::string("fieldSelector=") + (nodes ? "metadata.name" : "spec.nodeName") +
                  "%3D" + escaped(collection.node);
  }
  return at;
}

}  // namespace

ApiResponse ApiCluster::get_node(const std::string& name, Deadline deadline) const {
  return client_.get(node_path(name), deadline);
}
ApiResponse ApiCluster::patch_node(const std::string& name, const nlohmann::json& patch,
                                   Deadline deadline) const {
  return client_.patch(node_path(name), dump_outside_json(patch), deadline);
}
ApiResponse ApiCluster::get_pod(const ObjectName& pod, Deadline deadline) const {
  return client_.get(pod_path(pod), deadline);
}
ApiResponse ApiCluster::patch_pod(const ObjectName& pod, const nlohmann::json& patch,
                                  Deadline deadline) const {
  return client_.patch(pod_path(pod), dump_outside_json(patch), deadline);
}
ApiResponse ApiCluster::bind_pod(const ObjectName& pod, const std::string& uid,
                                 const std::string& node, Deadline deadline) const {
  const nlohmann::json binding{
      {"apiVersion", "v1"},
      {"kind", "Binding"},
      {"metadata", {{"name", pod.name}, {"namespace", pod.name_space}, {"uid", uid}}},
      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  return client_.post(pod_path(pod) + "/binding", dump_outside_json(binding), deadline);
}
ApiResponse ApiCluster::list(const Collection& collection, Deadline deadline) const {
  const CollectionPath at = collection_path(collection);
  return client_.get(at.selector.empty() ? at.path : at.path + "?" + at.selector, deadline);
}
ApiResponse ApiCluster::watch(const Collection& collection, const std::string& version,
                              const std::function<bool(const std::string&)>& on_event,
                              const std::atomic<bool>& stop, int idle_seconds) const {
  const CollectionPath at = collection_path(collection);
  return client_.watch(
      fmt::format("{}?{}{}watch=1&allowWatchBookmarks=true&timeoutSeconds=300&resourceVersion={}",
                  at.path, at.selector, at.selector.empty() ? "" : "&", escaped(version)),
      on_event, stop, idle_seconds);
}
ApiResponse ApiCluster::get_lease(const ObjectName& lease, Deadline deadline) const {
  return client_.get(lease_path(lease), deadline);
}
ApiResponse ApiCluster::create_lease(const ObjectName& lease, const nlohmann::json& object,
                                     Deadline deadline) const {
  return client_.post(leases_path(lease.name_space), dump_outside_json(object), deadline);
}
ApiResponse ApiCluster::replace_lease(const ObjectName& lease, const nlohmann::json& object,
                                      Deadline deadline) const {
  return client_.put(lease_path(lease), dump_outside_json(object), deadline);
}

ApiResponse ApiCluster::get_resource_claim(const ObjectName& claim, Deadline deadline) const {
  return client_.get(claim_path(claim), deadline);
}
ApiResponse ApiCluster::list_resource_slices(const std::string& driver, const std::string& node,
                                             Deadline deadline) const {
  return client_.get(fmt::format("{}?fieldSelector=spec.driver%3D{}%2Cspec.nodeName%3D{}",
                                 kResourceSlices, escaped(driver), escaped(node)),
                     deadline);
}
ApiResponse ApiCluster::create_resource_slice(const nlohmann::json& object,
                                              Deadline deadline) const {
  return client_.post(kResourceSlices, dump_outside_json(object), deadline);
}
ApiResponse ApiCluster::replace_resource_slice(const std::string& name,
                                               const nlohmann::json& object,
                                               Deadline deadline) const {
  return client_.put(std::string(kResourceSlices) + "/" + escaped(name), dump_outside_json(object),
                     deadline);
}
ApiResponse ApiCluster::delete_resource_slice(const std::string& name, Deadline deadline) const {
  return client_.remove(std::string(kResourceSlices) + "/" + escaped(name), deadline);
}

}  // namespace tessera::kube
