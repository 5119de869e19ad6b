// The kubelet's pod-resources API (v1, on /var/lib/kubelet/pod-resources/kubelet.sock): which
// pod and container each allocated device ID belongs to. Once Allocate has returned, the kubelet
// records the container as the IDs' holder; the node agent asks it at PreStartContainer, so a
// container's limits come from its own pod whatever order pods were admitted in, with no lock
// and no guessing (docs/kubernetes.md).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::node {

struct KubeletContainer {
  std::string name;
  std::map<std::string, std::vector<std::string>> devices;  // device IDs by resource
};
struct KubeletPod {
  std::string name_space, name;
  std::vector<KubeletContainer> containers;
};

struct DeviceHolder {
  std::string pod_namespace, pod_name, container;
};

class PodResourcesClient {
 public:
  explicit PodResourcesClient(std::string socket);
  ~PodResourcesClient();
  PodResourcesClient(const PodResourcesClient&) = delete;
  PodResourcesClient& operator=(const PodResourcesClient&) = delete;

  // Every pod the kubelet holds (admitted, or being admitted) and its containers' devices.
  // A failure if the kubelet cannot be asked.
  base::Status list(std::vector<KubeletPod>& pods) const;
  // The container holding exactly `ids` (in any order) of `resource`, in `holder`; a failure
  // if the kubelet cannot be asked or names no holder.
  base::Status holder_of(const std::string& resource, const std::vector<std::string>& ids,
                         DeviceHolder& holder) const;

 private:
  struct Stub;
  std::string socket_;
  std::unique_ptr<Stub> stub_;
};

}  // namespace tessera::node
