#include "node/pod_resources.h"

#include <fmt/core.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "podresources_v1.grpc.pb.h"

namespace tessera::node {
namespace {

constexpr auto kCallBudget = std::chrono::seconds(5);
constexpr int kMostAnswerBytes = 16 << 20;  // the kubelet's own limit on this API

}  // namespace

struct PodResourcesClient::Stub {
  std::unique_ptr<v1::PodResourcesLister::Stub> lister;
};

PodResourcesClient::PodResourcesClient(std::string socket)
    : socket_(std::move(socket)), stub_(std::make_unique<Stub>()) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMostAnswerBytes);
  stub_->lister = v1::PodResourcesLister::NewStub(grpc::CreateCustomChannel(
      "unix://" + socket_, grpc::InsecureChannelCredentials(), arguments));
}

PodResourcesClient::~PodResourcesClient() = default;

base::Status PodResourcesClient::list(std::vector<KubeletPod>& pods) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallBudget);
  v1::ListPodResourcesResponse answer;
  const grpc::Status status = stub_->lister->List(&context, v1::ListPodResourcesRequest(), &answer);
  if (!status.ok()) {
    return base::Status::failure(
        fmt::format("the kubelet's pod-resources API ({}) does not answer: {}", socket_,
                    status.error_message()));
  }
  pods.clear();
  for (const v1::PodResources& pod : answer.pod_resources()) {
    KubeletPod entry{pod.namespace_(), pod.name(), {}};
    for (const v1::ContainerResources& container : pod.containers()) {
      KubeletContainer held{container.name(), {}};
      for (const v1::ContainerDevices& devices : container.devices()) {
        auto& ids = held.devices[devices.resource_name()];
        ids.insert(ids.end(), devices.device_ids().begin(), devices.device_ids().end());
      }
      entry.containers.push_back(std::move(held));
    }
    pods.push_back(std::move(entry));
  }
  return base::Status::success();
}

base::Status PodResourcesClient::holder_of(const std::string& resource,
                                           const std::vector<std::string>& ids,
                                           DeviceHolder& holder) const {
  std::vector<KubeletPod> pods;
  if (base::Status listed = list(pods); !listed.ok()) return listed;
  std::vector<std::string> wanted = ids;
  std::sort(wanted.begin(), wanted.end());
  for (const KubeletPod& pod : pods) {
    for (const KubeletContainer& container : pod.containers) {
      const auto held = container.devices.find(resource);
      if (held == container.devices.end()) continue;
      std::vector<std::string> have = held->second;
      std::sort(have.begin(), have.end());
      if (have == wanted) {
        holder = DeviceHolder{pod.name_space, pod.name, container.name};
        return base::Status::success();
      }
    }
  }
  const std::string named = ids.empty() ? std::string("(none)")
                            : ids.size() == 1
                                ? ids.front()
                                : fmt::format("{} and {} more", ids.front(), ids.size() - 1);
  return base::Status::failure(
      fmt::format("the kubelet names no container holding {} {}", resource, named));
}

}  // namespace tessera::node
