// A kubelet as device plugins meet it, for tests, benchmarks and the demo: it serves the
// Registration service on kubelet.sock over real gRPC, connects to each plugin that
// registers, follows its ListAndWatch stream, and calls GetPreferredAllocation, Allocate and
// PreStartContainer as the kubelet's device manager does. restart() does what a kubelet
// restart does to the directory: every socket in it is removed and kubelet.sock made anew.
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

  explicit TestKubelet(std::string directory);
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

  class Service;

 private:
  struct Plugin {
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
};

}  // namespace tessera::test
