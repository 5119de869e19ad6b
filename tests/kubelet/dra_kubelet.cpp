#include "dra_kubelet.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <thread>

#include "contract/dra.h"

namespace tessera::test {
namespace {

namespace v1 = k8s::io::kubelet::pkg::apis::dra::v1;
namespace v1beta1 = k8s::io::kubelet::pkg::apis::dra::v1beta1;

// A call as the kubelet makes it: waiting for a plugin that is still starting, within 10 s.
void as_the_kubelet(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  context.set_wait_for_ready(true);
}

template <typename Request>
void fill(Request& request, const std::vector<DraKubelet::Claim>& claims) {
  for (const DraKubelet::Claim& claim : claims) {
    auto* entry = request.add_claims();
    entry->set_namespace_(claim.name_space);
    entry->set_uid(claim.uid);
    entry->set_name(claim.name);
  }
}

}  // namespace

bool DraKubelet::register_plugin(const std::string& driver, std::chrono::milliseconds timeout,
                                 std::string& why) {
  const std::string socket = contract::dra_registration_socket(registry_dir_, driver);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // The kubelet's plugin watcher sees the socket appear; polling stands in for its inotify.
  while (!std::filesystem::exists(socket)) {
    if (std::chrono::steady_clock::now() > deadline) {
      why = socket + " did not appear";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto registration = pluginregistration::Registration::NewStub(
      grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  as_the_kubelet(context);
  const grpc::Status asked =
      registration->GetInfo(&context, pluginregistration::InfoRequest(), &info_);
  if (!asked.ok()) {
    why = "GetInfo: " + asked.error_message();
    return false;
  }
  pluginregistration::RegistrationStatus status;
  const bool good = info_.type() == "DRAPlugin" && info_.name() == driver;
  status.set_plugin_registered(good);
  if (!good) status.set_error("not a DRA plugin named " + driver);
  grpc::ClientContext notify;
  as_the_kubelet(notify);
  pluginregistration::RegistrationStatusResponse ignored;
  const grpc::Status told = registration->NotifyRegistrationStatus(&notify, status, &ignored);
  if (!good || !told.ok()) {
    why = good ? "NotifyRegistrationStatus: " + told.error_message()
               : "GetInfo answered type '" + info_.type() + "', name '" + info_.name() + "'";
    return false;
  }
  channel_ = grpc::CreateChannel("unix://" + info_.endpoint(), grpc::InsecureChannelCredentials());
  return true;
}

grpc::Status DraKubelet::prepare(const std::vector<Claim>& claims,
                                 v1::NodePrepareResourcesResponse& answer) {
  v1::NodePrepareResourcesRequest request;
  fill(request, claims);
  grpc::ClientContext context;
  as_the_kubelet(context);
  return v1::DRAPlugin::NewStub(channel_)->NodePrepareResources(&context, request, &answer);
}

grpc::Status DraKubelet::unprepare(const std::vector<Claim>& claims,
                                   v1::NodeUnprepareResourcesResponse& answer) {
  v1::NodeUnprepareResourcesRequest request;
  fill(request, claims);
  grpc::ClientContext context;
  as_the_kubelet(context);
  return v1::DRAPlugin::NewStub(channel_)->NodeUnprepareResources(&context, request, &answer);
}

grpc::Status DraKubelet::prepare_v1beta1(const std::vector<Claim>& claims,
                                         v1beta1::NodePrepareResourcesResponse& answer) {
  v1beta1::NodePrepareResourcesRequest request;
  fill(request, claims);
  grpc::ClientContext context;
  as_the_kubelet(context);
  return v1beta1::DRAPlugin::NewStub(channel_)->NodePrepareResources(&context, request, &answer);
}

}  // namespace tessera::test
