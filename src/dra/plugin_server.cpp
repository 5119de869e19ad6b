#include "dra/plugin_server.h"

#include <fmt/core.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "contract/dra.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace tessera::dra {
namespace {

grpc::Status too_many(int claims) {
  return {grpc::StatusCode::RESOURCE_EXHAUSTED,
          fmt::format("{} claims in one request; at most {}", claims, kMostClaimsPerRequest)};
}

// One version of the API's types: the versions differ only in their package.
#define TESSERA_DRA_API(name, package)                                              \
  struct name {                                                                     \
    using DRAPlugin = package::DRAPlugin;                                           \
    using NodePrepareResourcesRequest = package::NodePrepareResourcesRequest;       \
    using NodePrepareResourcesResponse = package::NodePrepareResourcesResponse;     \
    using NodeUnprepareResourcesRequest = package::NodeUnprepareResourcesRequest;   \
    using NodeUnprepareResourcesResponse = package::NodeUnprepareResourcesResponse; \
  };
TESSERA_DRA_API(ApiV1, k8s::io::kubelet::pkg::apis::dra::v1)
TESSERA_DRA_API(ApiV1beta1, k8s::io::kubelet::pkg::apis::dra::v1beta1)
#undef TESSERA_DRA_API

ClaimRef claim_of(const auto& claim) {
  return {claim.namespace_(), claim.uid(), claim.name()};
}

// The DRAPlugin service for one version of the API: the messages differ only in package.
template <typename Api>
class DraService final : public Api::DRAPlugin::Service {
 public:
  explicit DraService(DraDriver& driver) : driver_(driver) {}

  grpc::Status NodePrepareResources(grpc::ServerContext*,
                                    const typename Api::NodePrepareResourcesRequest* request,
                                    typename Api::NodePrepareResourcesResponse* response) override {
    if (request->claims_size() > kMostClaimsPerRequest) return too_many(request->claims_size());
    for (const auto& claim : request->claims()) {
      const PrepareAnswer answer = driver_.prepare(claim_of(claim));
      auto& entry = (*response->mutable_claims())[claim.uid()];
      entry.set_error(answer.error);
      for (const PreparedDevice& device : answer.devices) {
        auto* out = entry.add_devices();
        for (const std::string& request_name : device.request_names) {
          out->add_request_names(request_name);
        }
        out->set_pool_name(device.pool);
        out->set_device_name(device.device);
        for (const std::string& id : device.cdi_device_ids) out->add_cdi_device_ids(id);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status NodeUnprepareResources(
      grpc::ServerContext*, const typename Api::NodeUnprepareResourcesRequest* request,
      typename Api::NodeUnprepareResourcesResponse* response) override {
    if (request->claims_size() > kMostClaimsPerRequest) return too_many(request->claims_size());
    for (const auto& claim : request->claims()) {
      (*response->mutable_claims())[claim.uid()].set_error(driver_.unprepare(claim_of(claim)));
    }
    return grpc::Status::OK;
  }

 private:
  DraDriver& driver_;
};

void remove_stale(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw std::runtime_error(
        fmt::format("cannot remove the stale socket {}: {}", path, std::strerror(errno)));
  }
}

}  // namespace

class DraPluginServer::Services final : public pluginregistration::Registration::Service {
 public:
  explicit Services(DraPluginServer& owner)
      : owner_(owner), v1_(owner.driver_impl_), v1beta1_(owner.driver_impl_) {}

  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* info) override {
    info->set_type(kDraPluginType);
    info->set_name(owner_.driver_);
    info->set_endpoint(owner_.plugin_socket());
    info->add_supported_versions("v1.DRAPlugin");
    info->add_supported_versions("v1beta1.DRAPlugin");
    return grpc::Status::OK;
  }

  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* status,
                                        pluginregistration::RegistrationStatusResponse*) override {
    owner_.registered_ = status->plugin_registered();
    base::tell(owner_.report_, status->plugin_registered()
                                   ? fmt::format("dra: the kubelet registered {}", owner_.driver_)
                                   : fmt::format("dra: the kubelet refused {}: {}", owner_.driver_,
                                                 status->error().substr(0, 512)));
    return grpc::Status::OK;
  }

  grpc::Service* v1() { return &v1_; }
  grpc::Service* v1beta1() { return &v1beta1_; }

 private:
  DraPluginServer& owner_;
  DraService<ApiV1> v1_;
  DraService<ApiV1beta1> v1beta1_;
};

DraPluginServer::DraPluginServer(std::string driver, std::string registry_dir,
                                 std::string plugins_dir, DraDriver& driver_impl,
                                 base::Reporter report)
    : driver_(std::move(driver)),
      registry_dir_(std::move(registry_dir)),
      plugins_dir_(std::move(plugins_dir)),
      driver_impl_(driver_impl),
      report_(std::move(report)) {}

DraPluginServer::~DraPluginServer() {
  stop();
}

std::string DraPluginServer::registration_socket() const {
  return contract::dra_registration_socket(registry_dir_, driver_);
}

std::string DraPluginServer::plugin_socket() const {
  return contract::dra_plugin_socket(plugins_dir_, driver_);
}

void DraPluginServer::start() {
  stop();
  for (const std::string& directory : {registry_dir_, plugins_dir_ + "/" + driver_}) {
    std::error_code error;
    std::filesystem::create_directories(directory, error);
    if (error) {
      throw std::runtime_error(fmt::format("cannot create {}: {}", directory, error.message()));
    }
  }
  services_ = std::make_unique<Services>(*this);
  // The plugin's socket first: the kubelet calls it as soon as registration succeeds.
  remove_stale(plugin_socket());
  grpc::ServerBuilder plugin;
  plugin.AddListeningPort("unix://" + plugin_socket(), grpc::InsecureServerCredentials());
  plugin.RegisterService(services_->v1());
  plugin.RegisterService(services_->v1beta1());
  plugin_server_ = plugin.BuildAndStart();
  if (plugin_server_ == nullptr) {
    services_.reset();
    throw std::runtime_error(fmt::format("cannot serve {} on {}", driver_, plugin_socket()));
  }
  remove_stale(registration_socket());
  grpc::ServerBuilder registration;
  registration.AddListeningPort("unix://" + registration_socket(),
                                grpc::InsecureServerCredentials());
  registration.RegisterService(services_.get());
  registration_server_ = registration.BuildAndStart();
  if (registration_server_ == nullptr) {
    stop();
    throw std::runtime_error(
        fmt::format("cannot serve {}'s registration on {}", driver_, registration_socket()));
  }
}

void DraPluginServer::stop() {
  for (std::unique_ptr<grpc::Server>* server : {&registration_server_, &plugin_server_}) {
    if (*server == nullptr) continue;
    (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    (*server)->Wait();
    server->reset();
  }
  if (services_ == nullptr) return;
  services_.reset();
  unlink(registration_socket().c_str());
  unlink(plugin_socket().c_str());
  registered_ = false;
}

}  // namespace tessera::dra
