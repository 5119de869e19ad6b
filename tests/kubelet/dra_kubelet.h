// The kubelet's side of DRA, for tests, benchmarks and the demo: it watches the plugins
// registry directory for a plugin's registration socket, asks it GetInfo, says it took the
// plugin (NotifyRegistrationStatus), and then calls NodePrepareResources and
// NodeUnprepareResources on the endpoint the plugin named, over real gRPC, as the kubelet's
// DRA manager does before a pod's containers start and after they end.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace tessera::test {

class DraKubelet {
 public:
  struct Claim {
    std::string name_space = "default", uid, name;
  };

  explicit DraKubelet(std::string registry_dir) : registry_dir_(std::move(registry_dir)) {}

  // Waits for `driver`'s registration socket, asks GetInfo, checks it is a DRA plugin, and
  // tells it it is registered. False (with `why`) on timeout or a bad answer.
  bool register_plugin(const std::string& driver, std::chrono::milliseconds timeout,
                       std::string& why);
  const pluginregistration::PluginInfo& info() const { return info_; }

  grpc::Status prepare(const std::vector<Claim>& claims,
                       k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse& answer);
  grpc::Status unprepare(
      const std::vector<Claim>& claims,
      k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse& answer);
  // The same through v1beta1, as a kubelet of 1.33 calls it.
  grpc::Status prepare_v1beta1(
      const std::vector<Claim>& claims,
      k8s::io::kubelet::pkg::apis::dra::v1beta1::NodePrepareResourcesResponse& answer);

 private:
  std::string registry_dir_;
  pluginregistration::PluginInfo info_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace tessera::test
