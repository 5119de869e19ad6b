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
// The collection's path with its field selector, if any; its query is begun.
std::string collection_path(const Collection& collection) {
  if (collection.kind == Collection::Kind::nodes) {
    return collection.node.empty()
               ? "/api/v1/nodes?"
               : "/api/v1/nodes?fieldSelector=metadata.name%3D" + escaped(collection.node) + "&";
  }
  return collection.node.empty()
             ? "/api/v1/pods?"
             : "/api/v1/pods?fieldSelector=spec.nodeName%3D" + escaped(collection.node) + "&";
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
  std::string path = collection_path(collection);
  path.pop_back();  // no query beyond the selector
  return client_.get(path, deadline);
}
ApiResponse ApiCluster::watch(const Collection& collection, const std::string& version,
                              const std::function<bool(const std::string&)>& on_event,
                              const std::atomic<bool>& stop, int idle_seconds) const {
  return client_.watch(
      fmt::format("{}watch=1&allowWatchBookmarks=true&timeoutSeconds=300&resourceVersion={}",
                  collection_path(collection), escaped(version)),
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

}  // namespace tessera::kube
