// A kubelet as device plugins meet it, for tests, benchmarks and the demo: it serves the
// Registration service on kubelet.sock over real gRPC, connects to each plugin that
// registers, follows its ListAndWatch stream, and calls GetPreferredAllocation, Allocate and
// PreStartContainer as the kubelet's device manager does. restart() does what a kubelet
// restart does to the directory: every socket in it is removed and kubelet.sock made anew.
//
// It admits pods as the kubelet does: a pod is held (and listed by the pod-resources API, v1,
// served on its own socket) from the start of its admission; each of its containers' devices
// are chosen among the healthy free ones (the plugin asked which it prefers), allocated, and
// recorded as that container's once Allocate returns; a container is started with
// PreStartContainer where the plugin asked for it. Like the kubelet, it admits one pod at a
// time, unless told to admit concurrently (which no kubelet does: a test of the worst case).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "deviceplugin_v1beta1.grpc.pb.h"
#include "podresources_v1.grpc.pb.h"

namespace tessera::test {

class TestKubelet {
 public:
  using Clock = std::chrono::steady_clock;
  struct Registration {
    std::string resource, endpoint, version;
    bool preferred_allocation = false;
    Clock::time_point at;
  };
  struct DeviceState {
    std::string health;
    std::vector<std::int64_t> numa_nodes;
  };
  using Devices = std::map<std::string, DeviceState>;  // by ID
  struct ListUpdate {
    Devices devices;
    Clock::time_point at;
  };

  // A pod as the kubelet admits it: its containers' device-plugin resources, by count.
  struct PodSpec {
    std::string name_space = "default", name;
    struct Container {
      std::string name;
      std::map<std::string, int> devices;
    };
    std::vector<Container> containers;
  };
  // What each container was given: its devices and the plugins' answers, per resource.
  struct AdmittedContainer {
    std::string name;
    std::map<std::string, std::vector<std::string>> devices;
    std::vector<v1beta1::ContainerAllocateResponse> answers;
  };

  // `directory`: the device plugins' (kubelet.sock is made there). The pod-resources API is
  // served on `pod_resources_socket`, by default <directory>/../pod-resources/kubelet.sock.
  explicit TestKubelet(std::string directory, std::string pod_resources_socket = "");
  ~TestKubelet();
  TestKubelet(const TestKubelet&) = delete;
  TestKubelet& operator=(const TestKubelet&) = delete;

  // Stops serving, removes every socket in the directory, and serves kubelet.sock again.
  void restart();
  const std::string& directory() const { return directory_; }

  std::vector<Registration> registrations() const;
  // Waits for a registration of `resource` after `since`; false when `timeout` passes first.
  bool wait_for_registration(const std::string& resource, Clock::time_point since,
                             std::chrono::milliseconds timeout, Registration* found = nullptr);
  // The latest list the plugin for `resource` sent (empty if none).
  Devices devices(const std::string& resource) const;
  std::vector<ListUpdate> updates(const std::string& resource) const;
  // Waits until the latest list of `resource` satisfies `ready`; false on timeout.
  bool wait_for_devices(const std::string& resource,
                        const std::function<bool(const Devices&)>& ready,
                        std::chrono::milliseconds timeout, Devices* found = nullptr);
  std::vector<std::string> resources() const;

  // Calls to the plugin registered for `resource`.
  grpc::Status allocate(const std::string& resource,
                        const std::vector<std::vector<std::string>>& containers,
                        v1beta1::AllocateResponse& response);
  grpc::Status preferred(const std::string& resource, const std::vector<std::string>& available,
                         const std::vector<std::string>& must_include, int size,
                         std::vector<std::string>& chosen);
  grpc::Status pre_start(const std::string& resource, const std::vector<std::string>& ids);
  grpc::Status options(const std::string& resource, v1beta1::DevicePluginOptions& options);

  // Admits `pod`; on a refusal, what it took is freed and the pod is no longer held.
  grpc::Status admit(const PodSpec& pod, std::vector<AdmittedContainer>& containers);
  // Starts one of an admitted pod's containers: PreStartContainer for each of its resources
  // whose plugin registered asking for it.
  grpc::Status start(const std::string& name_space, const std::string& pod,
                     const std::string& container);
  // The pod is gone: its devices are free, and the pod-resources API no longer lists it.
  void remove(const std::string& name_space, const std::string& pod);
  void set_concurrent_admission(bool concurrent) { concurrent_admission_ = concurrent; }
  class PodResources;

  class Service;

 private:
  struct Plugin {
    bool pre_start_required = false;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
    std::unique_ptr<grpc::ClientContext> watch_context;
    std::thread watcher;
  };
  void serve();
  void on_register(const v1beta1::RegisterRequest& request);
  void watch(const std::string& resource, Plugin* plugin);
  std::shared_ptr<Plugin> plugin(const std::string& resource) const;
  void drop_plugins();

  std::string directory_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Registration> registrations_;
  std::map<std::string, std::shared_ptr<Plugin>> plugins_;
  std::vector<std::shared_ptr<Plugin>> retired_;  // replaced by a new registration
  std::map<std::string, std::vector<ListUpdate>> lists_;

  // The pods it holds, as the pod-resources API lists them (under mutex_).
  struct HeldPod {
    std::string name_space, name;
    std::vector<AdmittedContainer> containers;
  };
  std::vector<HeldPod> pods_;
  std::map<std::string, std::string> taken_;  // device "resource/id" -> holding pod key
  std::mutex admission_mutex_;                // one admission at a time, as the kubelet
  bool concurrent_admission_ = false;
  std::string pod_resources_socket_;
  std::unique_ptr<PodResources> pod_resources_service_;
  std::unique_ptr<grpc::Server> pod_resources_server_;
};

}  // namespace tessera::test
