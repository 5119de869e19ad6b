#include "contract/api_paths.h"

#include <fmt/core.h>

namespace tessera::contract::api {
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

}  // namespace

std::string nodes() {
  return "/api/v1/nodes";
}
std::string node(const std::string& name) {
  return nodes() + "/" + escaped(name);
}
std::string node_named(const std::string& name) {
  return nodes() + "?fieldSelector=metadata.name%3D" + escaped(name);
}
std::string pods() {
  return "/api/v1/pods";
}
std::string pods_on_node(const std::string& node) {
  return pods() + "?fieldSelector=spec.nodeName%3D" + escaped(node);
}
std::string pod(const std::string& name_space, const std::string& name) {
  return fmt::format("/api/v1/namespaces/{}/pods/{}", escaped(name_space), escaped(name));
}
std::string pod_binding(const std::string& name_space, const std::string& name) {
  return pod(name_space, name) + "/binding";
}
std::string leases(const std::string& name_space) {
  return fmt::format("/apis/coordination.k8s.io/v1/namespaces/{}/leases", escaped(name_space));
}
std::string lease(const std::string& name_space, const std::string& name) {
  return leases(name_space) + "/" + escaped(name);
}

}  // namespace tessera::contract::api
