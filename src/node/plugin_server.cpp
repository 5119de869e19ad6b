#include "node/plugin_server.h"

#include <fmt/core.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "deviceplugin_v1beta1.grpc.pb.h"

namespace tessera::node {

void ChangeSignal::notify() {
  {
    base::MutexLock locked(mutex_);
    ++generation_;
  }
  changed_.notify_all();
}

std::uint64_t ChangeSignal::generation() const {
  base::MutexLock locked(mutex_);
  return generation_;
}

std::uint64_t ChangeSignal::wait(std::uint64_t seen, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  base::MutexLock locked(mutex_);
  while (generation_ == seen && changed_.wait_until(mutex_, deadline)) {
  }
  return generation_;
}

namespace {
constexpr std::string_view kSocketPrefix = "tessera-", kSocketSuffix = ".sock";
}  // namespace

std::string socket_name_for(const std::string& resource) {
  const std::size_t slash = resource.find('/');
  return std::string(kSocketPrefix) +
         (slash == std::string::npos ? resource : resource.substr(slash + 1)) +
         std::string(kSocketSuffix);
}

bool is_device_plugin_socket_name(const std::string& name) {
  return name.size() > kSocketPrefix.size() + kSocketSuffix.size() &&
         name.starts_with(kSocketPrefix) && name.ends_with(kSocketSuffix);
}

class DevicePluginServer::Service final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Service(DevicePluginServer& owner) : owner_(owner) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* options) override {
    options->set_get_preferred_allocation_available(true);
    options->set_pre_start_required(owner_.callbacks_.pre_start_required);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    std::string last_sent;
    std::uint64_t generation = owner_.signal_.generation();
    bool first = true;
    while (!owner_.stopping_ && !context->IsCancelled()) {
      v1beta1::ListAndWatchResponse response;
      for (const PluginDevice& device : owner_.callbacks_.list()) {
        v1beta1::Device* entry = response.add_devices();
        entry->set_id(device.id);
        entry->set_health(device.healthy ? "Healthy" : "Unhealthy");
        if (device.numa_node >= 0) entry->mutable_topology()->add_nodes()->set_id(device.numa_node);
      }
      // The full list on connect, and again whenever it changes.
      std::string serialized = response.SerializeAsString();
      if (first || serialized != last_sent) {
        if (!writer->Write(response)) break;  // the kubelet went away
        last_sent = std::move(serialized);
        first = false;
      }
      // Cancellation is only seen by looking: no wait is longer than a fifth of a second.
      generation = owner_.signal_.wait(generation, std::chrono::milliseconds(200));
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    try {
      for (const auto& container : request->container_requests()) {
        const std::vector<std::string> available(container.available_deviceids().begin(),
                                                 container.available_deviceids().end());
        const std::vector<std::string> required(container.must_include_deviceids().begin(),
                                                container.must_include_deviceids().end());
        auto* answer = response->add_container_responses();
        for (const std::string& id :
             owner_.callbacks_.prefer(available, required, container.allocation_size())) {
          answer->add_deviceids(id);
        }
      }
    } catch (const std::exception& refused) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          fmt::format("error getting list of preferred allocation devices: {}", refused.what()));
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    try {
      for (const auto& container : request->container_requests()) {
        const std::vector<std::string> ids(container.devices_ids().begin(),
                                           container.devices_ids().end());
        const ContainerAllocation allocation = owner_.callbacks_.allocate(ids);
        auto* answer = response->add_container_responses();
        for (const auto& [name, value] : allocation.envs) (*answer->mutable_envs())[name] = value;
        for (const MountSpec& mount : allocation.mounts) {
          auto* entry = answer->add_mounts();
          entry->set_container_path(mount.container_path);
          entry->set_host_path(mount.host_path);
          entry->set_read_only(mount.read_only);
        }
        for (const DeviceNodeSpec& node : allocation.devices) {
          auto* entry = answer->add_devices();
          entry->set_container_path(node.container_path);
          entry->set_host_path(node.host_path);
          entry->set_permissions(node.permissions);
        }
        for (const auto& [key, value] : allocation.annotations) {
          (*answer->mutable_annotations())[key] = value;
        }
        for (const std::string& name : allocation.cdi_devices)
          answer->add_cdi_devices()->set_name(name);
      }
    } catch (const std::exception& refused) {  // AllocationError, or a defect: said either way
      ++owner_.refusals_;
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, refused.what());
    }
    owner_.allocations_ += static_cast<std::uint64_t>(request->container_requests_size());
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*,
                                 const v1beta1::PreStartContainerRequest* request,
                                 v1beta1::PreStartContainerResponse*) override {
    if (!owner_.callbacks_.pre_start) return grpc::Status::OK;
    try {
      owner_.callbacks_.pre_start({request->devices_ids().begin(), request->devices_ids().end()});
    } catch (const std::exception& refused) {  // the container does not start; the kubelet
      ++owner_.refusals_;                      // retries it and shows why
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, refused.what());
    }
    return grpc::Status::OK;
  }

 private:
  DevicePluginServer& owner_;
};

DevicePluginServer::DevicePluginServer(std::string resource, std::string directory,
                                       PluginCallbacks callbacks, const ChangeSignal& signal)
    : resource_(std::move(resource)),
      directory_(std::move(directory)),
      socket_name_(socket_name_for(resource_)),
      callbacks_(std::move(callbacks)),
      signal_(signal) {}

DevicePluginServer::~DevicePluginServer() {
  stop();
}

void DevicePluginServer::start() {
  stop();
  stopping_ = false;
  const std::string path = socket_path();
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw std::runtime_error(
        fmt::format("cannot remove the stale socket {}: {}", path, std::strerror(errno)));
  }
  service_ = std::make_unique<Service>(*this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    service_.reset();
    throw std::runtime_error(fmt::format("cannot serve {} on {}", resource_, path));
  }
}

void DevicePluginServer::stop() {
  if (server_ == nullptr) return;
  stopping_ = true;  // open ListAndWatch streams end within their next wait
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
  service_.reset();
  unlink(socket_path().c_str());
}

base::Status DevicePluginServer::register_with_kubelet() const {
  auto channel = grpc::CreateChannel("unix://" + directory_ + "/" + kKubeletSocket,
                                     grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest request;
  request.set_version(kDevicePluginVersion);
  request.set_endpoint(socket_name_);
  request.set_resource_name(resource_);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  request.mutable_options()->set_pre_start_required(callbacks_.pre_start_required);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::Empty answer;
  const grpc::Status status = stub->Register(&context, request, &answer);
  if (!status.ok()) {
    return base::Status::failure(fmt::format("registering {} with the kubelet failed: {}",
                                             resource_, status.error_message()));
  }
  return base::Status::success();
}

}  // namespace tessera::node
