#include "test_kubelet.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

namespace tessera::test {

namespace fs = std::filesystem;

class TestKubelet::Service final : public v1beta1::Registration::Service {
 public:
  explicit Service(TestKubelet& owner) : owner_(owner) {}
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    // As the kubelet: the version must be one it speaks, and the endpoint a socket it can reach.
    if (request->version() != "v1beta1") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "unsupported device plugin API version: " + request->version());
    }
    if (request->resource_name().find('/') == std::string::npos) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "invalid extended resource name: " + request->resource_name());
    }
    try {
      owner_.on_register(*request);
    } catch (const std::exception& failure) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, failure.what());
    }
    return grpc::Status::OK;
  }

 private:
  TestKubelet& owner_;
};

// The pod-resources API, v1: the pods the kubelet holds and their containers' devices.
class TestKubelet::PodResources final : public v1::PodResourcesLister::Service {
 public:
  explicit PodResources(TestKubelet& owner) : owner_(owner) {}
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* response) override {
    std::lock_guard<std::mutex> locked(owner_.mutex_);
    for (const HeldPod& pod : owner_.pods_) describe(pod, *response->add_pod_resources());
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* request,
                   v1::GetPodResourcesResponse* response) override {
    std::lock_guard<std::mutex> locked(owner_.mutex_);
    for (const HeldPod& pod : owner_.pods_) {
      if (pod.name_space == request->pod_namespace() && pod.name == request->pod_name()) {
        describe(pod, *response->mutable_pod_resources());
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "pod " + request->pod_namespace() + "/" +
                                                         request->pod_name() + " not found");
  }

 private:
  static void describe(const HeldPod& pod, v1::PodResources& out) {
    out.set_name(pod.name);
    out.set_namespace_(pod.name_space);
    for (const AdmittedContainer& container : pod.containers) {
      v1::ContainerResources* entry = out.add_containers();
      entry->set_name(container.name);
      for (const auto& [resource, ids] : container.devices) {
        v1::ContainerDevices* devices = entry->add_devices();
        devices->set_resource_name(resource);
        for (const std::string& id : ids) devices->add_device_ids(id);
      }
    }
  }
  TestKubelet& owner_;
};

TestKubelet::TestKubelet(std::string directory, std::string pod_resources_socket)
    : directory_(std::move(directory)), pod_resources_socket_(std::move(pod_resources_socket)) {
  fs::create_directories(directory_);
  serve();
  if (pod_resources_socket_.empty()) {
    pod_resources_socket_ =
        (fs::path(directory_).parent_path() / "pod-resources" / "kubelet.sock").string();
  }
  fs::create_directories(fs::path(pod_resources_socket_).parent_path());
  fs::remove(pod_resources_socket_);
  pod_resources_service_ = std::make_unique<PodResources>(*this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + pod_resources_socket_, grpc::InsecureServerCredentials());
  builder.RegisterService(pod_resources_service_.get());
  pod_resources_server_ = builder.BuildAndStart();
  if (pod_resources_server_ == nullptr) {
    throw std::runtime_error("the test kubelet cannot serve " + pod_resources_socket_);
  }
}

TestKubelet::~TestKubelet() {
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  pod_resources_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  pod_resources_server_->Wait();
  drop_plugins();
}

void TestKubelet::serve() {
  const std::string socket = directory_ + "/kubelet.sock";
  fs::remove(socket);
  service_ = std::make_unique<Service>(*this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) throw std::runtime_error("the test kubelet cannot serve " + socket);
}

void TestKubelet::drop_plugins() {
  std::map<std::string, std::shared_ptr<Plugin>> plugins;
  std::vector<std::shared_ptr<Plugin>> retired;
  {
    std::lock_guard<std::mutex> locked(mutex_);
    plugins.swap(plugins_);
    retired.swap(retired_);
  }
  for (auto* list : {&retired}) {
    for (auto& plugin : *list) {
      plugin->watch_context->TryCancel();
      if (plugin->watcher.joinable()) plugin->watcher.join();
    }
  }
  for (auto& [name, plugin] : plugins) {
    plugin->watch_context->TryCancel();
    if (plugin->watcher.joinable()) plugin->watcher.join();
  }
}

void TestKubelet::restart() {
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
  drop_plugins();
  // What a starting kubelet does: the plugins' sockets go, then its own comes.
  for (const auto& entry : fs::directory_iterator(directory_)) {
    struct stat info {};
    if (lstat(entry.path().c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) fs::remove(entry.path());
  }
  serve();
}

void TestKubelet::on_register(const v1beta1::RegisterRequest& request) {
  auto plugin = std::make_shared<Plugin>();
  plugin->pre_start_required = request.options().pre_start_required();
  plugin->channel = grpc::CreateChannel("unix://" + directory_ + "/" + request.endpoint(),
                                        grpc::InsecureChannelCredentials());
  plugin->stub = v1beta1::DevicePlugin::NewStub(plugin->channel);
  plugin->watch_context = std::make_unique<grpc::ClientContext>();
  {
    std::lock_guard<std::mutex> locked(mutex_);
    registrations_.push_back({request.resource_name(), request.endpoint(), request.version(),
                              request.options().get_preferred_allocation_available(),
                              Clock::now()});
    // A resource registered again replaces its old endpoint, as the kubelet does.
    if (auto old = plugins_.find(request.resource_name()); old != plugins_.end()) {
      old->second->watch_context->TryCancel();
      retired_.push_back(old->second);
    }
    plugins_[request.resource_name()] = plugin;
  }
  changed_.notify_all();
  Plugin* raw = plugin.get();
  plugin->watcher = std::thread([this, name = request.resource_name(), raw] { watch(name, raw); });
}

void TestKubelet::watch(const std::string& resource, Plugin* plugin) {
  v1beta1::Empty empty;
  auto reader = plugin->stub->ListAndWatch(plugin->watch_context.get(), empty);
  v1beta1::ListAndWatchResponse response;
  while (reader->Read(&response)) {
    ListUpdate update{{}, Clock::now()};
    for (const auto& device : response.devices()) {
      DeviceState state{device.health(), {}};
      for (const auto& node : device.topology().nodes()) state.numa_nodes.push_back(node.id());
      update.devices[device.id()] = state;
    }
    {
      std::lock_guard<std::mutex> locked(mutex_);
      lists_[resource].push_back(std::move(update));
    }
    changed_.notify_all();
  }
  reader->Finish();
}

std::vector<TestKubelet::Registration> TestKubelet::registrations() const {
  std::lock_guard<std::mutex> locked(mutex_);
  return registrations_;
}

bool TestKubelet::wait_for_registration(const std::string& resource, Clock::time_point since,
                                        std::chrono::milliseconds timeout, Registration* found) {
  std::unique_lock<std::mutex> locked(mutex_);
  return changed_.wait_for(locked, timeout, [&] {
    for (const Registration& registration : registrations_) {
      if (registration.resource == resource && registration.at >= since) {
        if (found != nullptr) *found = registration;
        return true;
      }
    }
    return false;
  });
}

TestKubelet::Devices TestKubelet::devices(const std::string& resource) const {
  std::lock_guard<std::mutex> locked(mutex_);
  const auto found = lists_.find(resource);
  return found == lists_.end() || found->second.empty() ? Devices{} : found->second.back().devices;
}

std::vector<TestKubelet::ListUpdate> TestKubelet::updates(const std::string& resource) const {
  std::lock_guard<std::mutex> locked(mutex_);
  const auto found = lists_.find(resource);
  return found == lists_.end() ? std::vector<ListUpdate>{} : found->second;
}

bool TestKubelet::wait_for_devices(const std::string& resource,
                                   const std::function<bool(const Devices&)>& ready,
                                   std::chrono::milliseconds timeout, Devices* found) {
  std::unique_lock<std::mutex> locked(mutex_);
  return changed_.wait_for(locked, timeout, [&] {
    const auto list = lists_.find(resource);
    if (list == lists_.end() || list->second.empty() || !ready(list->second.back().devices))
      return false;
    if (found != nullptr) *found = list->second.back().devices;
    return true;
  });
}

std::vector<std::string> TestKubelet::resources() const {
  std::lock_guard<std::mutex> locked(mutex_);
  std::vector<std::string> names;
  for (const auto& [name, plugin] : plugins_) names.push_back(name);
  return names;
}

std::shared_ptr<TestKubelet::Plugin> TestKubelet::plugin(const std::string& resource) const {
  std::lock_guard<std::mutex> locked(mutex_);
  const auto found = plugins_.find(resource);
  return found == plugins_.end() ? nullptr : found->second;
}

namespace {

void set_deadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

grpc::Status unregistered(const std::string& resource) {
  return grpc::Status(grpc::StatusCode::NOT_FOUND, "no plugin registered for " + resource);
}

}  // namespace

grpc::Status TestKubelet::allocate(const std::string& resource,
                                   const std::vector<std::vector<std::string>>& containers,
                                   v1beta1::AllocateResponse& response) {
  const auto target = plugin(resource);
  if (target == nullptr) return unregistered(resource);
  v1beta1::AllocateRequest request;
  for (const auto& ids : containers) {
    auto* container = request.add_container_requests();
    for (const std::string& id : ids) container->add_devices_ids(id);
  }
  grpc::ClientContext context;
  set_deadline(context);
  return target->stub->Allocate(&context, request, &response);
}

grpc::Status TestKubelet::preferred(const std::string& resource,
                                    const std::vector<std::string>& available,
                                    const std::vector<std::string>& must_include, int size,
                                    std::vector<std::string>& chosen) {
  const auto target = plugin(resource);
  if (target == nullptr) return unregistered(resource);
  v1beta1::PreferredAllocationRequest request;
  auto* container = request.add_container_requests();
  for (const std::string& id : available) container->add_available_deviceids(id);
  for (const std::string& id : must_include) container->add_must_include_deviceids(id);
  container->set_allocation_size(size);
  v1beta1::PreferredAllocationResponse response;
  grpc::ClientContext context;
  set_deadline(context);
  const grpc::Status status = target->stub->GetPreferredAllocation(&context, request, &response);
  chosen.clear();
  if (status.ok() && response.container_responses_size() == 1) {
    for (const auto& id : response.container_responses(0).deviceids()) chosen.push_back(id);
  }
  return status;
}

grpc::Status TestKubelet::pre_start(const std::string& resource,
                                    const std::vector<std::string>& ids) {
  const auto target = plugin(resource);
  if (target == nullptr) return unregistered(resource);
  v1beta1::PreStartContainerRequest request;
  for (const std::string& id : ids) request.add_devices_ids(id);
  v1beta1::PreStartContainerResponse response;
  grpc::ClientContext context;
  set_deadline(context);
  return target->stub->PreStartContainer(&context, request, &response);
}

grpc::Status TestKubelet::admit(const PodSpec& pod, std::vector<AdmittedContainer>& containers) {
  std::unique_lock<std::mutex> serial(admission_mutex_, std::defer_lock);
  if (!concurrent_admission_) serial.lock();
  const std::string key = pod.name_space + "/" + pod.name;
  containers.clear();
  {
    std::lock_guard<std::mutex> locked(mutex_);
    for (const HeldPod& held : pods_) {
      if (held.name_space == pod.name_space && held.name == pod.name) {
        return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "pod " + key + " is admitted");
      }
    }
    // Held from the start of its admission, as the kubelet's pod manager holds it.
    HeldPod held{pod.name_space, pod.name, {}};
    for (const auto& container : pod.containers)
      held.containers.push_back({container.name, {}, {}});
    pods_.push_back(std::move(held));
  }
  auto refuse = [&](const grpc::Status& status) {
    remove(pod.name_space, pod.name);
    return status;
  };
  for (const auto& container : pod.containers) {
    AdmittedContainer admitted{container.name, {}, {}};
    for (const auto& [resource, count] : container.devices) {
      const auto target = plugin(resource);
      if (target == nullptr) return refuse(unregistered(resource));
      std::vector<std::string> chosen;
      for (int attempt = 0;; ++attempt) {  // concurrent admissions may take what was chosen
        std::vector<std::string> available;
        {
          std::lock_guard<std::mutex> locked(mutex_);
          const auto list = lists_.find(resource);
          if (list != lists_.end() && !list->second.empty()) {
            for (const auto& [id, state] : list->second.back().devices) {
              if (state.health == "Healthy" && !taken_.contains(resource + "/" + id))
                available.push_back(id);
            }
          }
        }
        if (static_cast<int>(available.size()) < count) {
          return refuse(
              grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "Insufficient " + resource));
        }
        chosen.assign(available.begin(), available.begin() + count);
        bool preferred_available = false;
        {
          std::lock_guard<std::mutex> locked(mutex_);
          for (const Registration& registration : registrations_) {
            if (registration.resource == resource)
              preferred_available = registration.preferred_allocation;
          }
        }
        if (preferred_available) {
          std::vector<std::string> preferred_ids;
          const grpc::Status asked = preferred(resource, available, {}, count, preferred_ids);
          if (!asked.ok()) return refuse(asked);
          // The kubelet takes the plugin's choice only where it is one it could make.
          if (static_cast<int>(preferred_ids.size()) == count &&
              std::all_of(preferred_ids.begin(), preferred_ids.end(), [&](const auto& id) {
                return std::find(available.begin(), available.end(), id) != available.end();
              })) {
            chosen = preferred_ids;
          }
        }
        std::lock_guard<std::mutex> locked(mutex_);
        if (std::none_of(chosen.begin(), chosen.end(),
                         [&](const auto& id) { return taken_.contains(resource + "/" + id); })) {
          for (const std::string& id : chosen) taken_[resource + "/" + id] = key;
          break;
        }
        if (attempt == 20) {
          return refuse(grpc::Status(grpc::StatusCode::ABORTED, "devices kept being taken"));
        }
      }
      v1beta1::AllocateResponse response;
      const grpc::Status allocated = allocate(resource, {chosen}, response);
      if (!allocated.ok()) return refuse(allocated);
      if (response.container_responses_size() != 1) {
        return refuse(grpc::Status(grpc::StatusCode::INTERNAL,
                                   "Allocate answered " +
                                       std::to_string(response.container_responses_size()) +
                                       " containers for 1"));
      }
      admitted.devices[resource] = chosen;
      admitted.answers.push_back(response.container_responses(0));
      // Recorded as the container's once Allocate has returned, as the kubelet records it.
      std::lock_guard<std::mutex> locked(mutex_);
      for (HeldPod& held : pods_) {
        if (held.name_space != pod.name_space || held.name != pod.name) continue;
        for (AdmittedContainer& entry : held.containers) {
          if (entry.name == container.name) entry.devices[resource] = chosen;
        }
      }
    }
    containers.push_back(std::move(admitted));
  }
  return grpc::Status::OK;
}

grpc::Status TestKubelet::start(const std::string& name_space, const std::string& pod,
                                const std::string& container) {
  std::map<std::string, std::vector<std::string>> devices;
  {
    std::lock_guard<std::mutex> locked(mutex_);
    for (const HeldPod& held : pods_) {
      if (held.name_space != name_space || held.name != pod) continue;
      for (const AdmittedContainer& entry : held.containers) {
        if (entry.name == container) devices = entry.devices;
      }
    }
  }
  for (const auto& [resource, ids] : devices) {
    const auto target = plugin(resource);
    if (target == nullptr) return unregistered(resource);
    if (!target->pre_start_required) continue;
    const grpc::Status started = pre_start(resource, ids);
    if (!started.ok()) return started;
  }
  return grpc::Status::OK;
}

void TestKubelet::remove(const std::string& name_space, const std::string& pod) {
  std::lock_guard<std::mutex> locked(mutex_);
  const std::string key = name_space + "/" + pod;
  std::erase_if(pods_, [&](const HeldPod& held) {
    return held.name_space == name_space && held.name == pod;
  });
  std::erase_if(taken_, [&](const auto& entry) { return entry.second == key; });
}

grpc::Status TestKubelet::options(const std::string& resource,
                                  v1beta1::DevicePluginOptions& options) {
  const auto target = plugin(resource);
  if (target == nullptr) return unregistered(resource);
  v1beta1::Empty empty;
  grpc::ClientContext context;
  set_deadline(context);
  return target->stub->GetDevicePluginOptions(&context, empty, &options);
}

}  // namespace tessera::test
