// The node agent's state directory (--state-dir, /var/lib/tessera in deploy/), as the agent
// lays it out and mounts it into containers (contract/layout.h has their side):
//
//   lib/libtessera-cuda.so           the hook             -> /usr/local/lib/tessera/...
//   lib/ld.so.preload                names the hook       -> /etc/ld.so.preload
//   devices/<key>.demand             each GPU's and MIG device's coordination file, where every
//                                    container on the device meets the others
//                                                         -> /var/run/tessera/devices/<key>.demand
//   containers/<id>/owner.json       who a container is (the agent's own; never mounted)
//   containers/<id>/group/           the container's own  -> /var/run/tessera
//   containers/<id>/group/group.ledger
//   containers/claim-<uid>/...       a DRA claim's, laid out alike
//   dra/claims/<uid>.json            what NodePrepareResources made for a claim (never mounted)
#pragma once

#include <string>

#include "contract/layout.h"

namespace tessera::contract {

// The node agent's state directory where none is given: a host path the kubelet mounts into
// containers, so the agent's DaemonSet mounts it at the same path (deploy/tessera-node.yaml).
inline constexpr const char* kDefaultStateDirectory = "/var/lib/tessera";
// The kubelet's: where device plugins register and serve, and its pod-resources API.
inline constexpr const char* kKubeletDevicePluginDirectory = "/var/lib/kubelet/device-plugins";
inline constexpr const char* kKubeletPodResourcesSocket =
    "/var/lib/kubelet/pod-resources/kubelet.sock";

// "devices/<key>.demand": a device's coordination file beside a ledger (coordination_path).
inline std::string coordination_name(const DeviceKey& key) {
  return std::string(kCoordinationDirectoryName) + "/" + key.text + kCoordinationSuffix;
}

class StateLayout {
 public:
  explicit StateLayout(std::string root) : root_(std::move(root)) {}

  std::string hook_library() const { return root_ + "/lib/libtessera-cuda.so"; }
  std::string preload_file() const { return root_ + "/lib/ld.so.preload"; }
  std::string coordination_directory() const { return root_ + "/" + kCoordinationDirectoryName; }
  std::string coordination_file(const DeviceKey& key) const {
    return root_ + "/" + coordination_name(key);
  }
  std::string containers() const { return root_ + "/containers"; }
  std::string container(const std::string& id) const { return containers() + "/" + id; }
  std::string owner_record(const std::string& id) const { return container(id) + "/owner.json"; }
  // Mounted at kContainerGroupDirectory.
  std::string group_directory(const std::string& id) const { return container(id) + "/group"; }
  std::string ledger(const std::string& id) const {
    return group_directory(id) + "/" + kLedgerFileName;
  }
  std::string dra_checkpoints() const { return root_ + "/dra/claims"; }
  // Where a device's coordination file is mounted in a container's group directory.
  std::string coordination_mount_point(const std::string& id, const DeviceKey& key) const {
    return group_directory(id) + "/" + coordination_name(key);
  }

 private:
  std::string root_;
};

// Inside a container: a device's coordination file.
inline std::string container_coordination_file(const DeviceKey& key) {
  return std::string(kContainerGroupDirectory) + "/" + coordination_name(key);
}

}  // namespace tessera::contract
