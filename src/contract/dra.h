// Tessera as a Kubernetes DRA driver: the names the node agent, the manifests in deploy/, the
// docs and the tests share. The driver's name is a DNS subdomain of the project's own domain,
// shaped like NVIDIA's gpu.nvidia.com, so that a user moving between the two reads the same
// structure; the opaque config's API group is the driver's, as DRA asks.
#pragma once

#include <string>

namespace tessera::contract {

inline constexpr const char* kDraDriverName = "gpu.tessera.io";
// The opaque config a claim or a DeviceClass gives the driver (dra/sharing_config.h).
inline constexpr const char* kDraConfigApiVersion = "gpu.tessera.io/v1alpha1";
inline constexpr const char* kDraConfigKind = "GpuSharing";
// NVIDIA's, accepted where they mean the same.
inline constexpr const char* kNvidiaDraConfigApiVersion = "resource.nvidia.com/v1beta1";

// The kubelet's: where plugins register and where DRA plugins keep their sockets.
inline constexpr const char* kKubeletPluginsRegistry = "/var/lib/kubelet/plugins_registry";
inline constexpr const char* kKubeletPluginsDirectory = "/var/lib/kubelet/plugins";
// A DRA plugin's sockets, by the kubelet's convention: the registration socket the kubelet
// finds in its registry directory, and the plugin's own.
inline std::string dra_registration_socket(const std::string& registry, const std::string& driver) {
  return registry + "/" + driver + "-reg.sock";
}
inline std::string dra_plugin_socket(const std::string& plugins, const std::string& driver) {
  return plugins + "/" + driver + "/dra.sock";
}
// Where the container runtime reads CDI specs.
inline constexpr const char* kCdiDirectory = "/var/run/cdi";
// A prepared claim's CDI devices are "<kind>=<claim uid>-<device>".
inline constexpr const char* kCdiKind = "k8s.gpu.tessera.io/claim";

// The capacities a shareable GPU publishes and a claim consumes.
inline constexpr const char* kDraMemoryCapacity = "memory";
inline constexpr const char* kDraCoresCapacity = "cores";

}  // namespace tessera::contract
