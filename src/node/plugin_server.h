// One kubelet device plugin (gRPC, v1beta1) for one resource: its socket in the kubelet's
// directory, registration with the kubelet, ListAndWatch with the full list on connect and on
// every change, GetPreferredAllocation, Allocate and PreStartContainer. What it answers comes
// from the node agent through callbacks; the server holds no state of its own beyond that.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "node/allocation.h"

namespace grpc {
class Server;
}

namespace tessera::node {

// Something the plugins' lists depend on changed (a resource, a GPU's health): every
// ListAndWatch stream wakes and sends its list again if it differs.
class ChangeSignal {
 public:
  void notify();
  std::uint64_t generation() const;
  // Waits until the generation differs from `seen`, or `timeout` passes.
  std::uint64_t wait(std::uint64_t seen, std::chrono::milliseconds timeout) const;

 private:
  mutable base::Mutex mutex_;
  mutable base::CondVar changed_;
  std::uint64_t generation_ GUARDED_BY(mutex_) = 0;
};

struct PluginDevice {
  std::string id;
  bool healthy = true;
  int numa_node = -1;
};

struct PluginCallbacks {
  std::function<std::vector<PluginDevice>()> list;
  std::function<std::vector<std::string>(const std::vector<std::string>& available,
                                         const std::vector<std::string>& must_include, int size)>
      prefer;
  // Throws AllocationError with the reason the kubelet shows.
  std::function<ContainerAllocation(const std::vector<std::string>& ids)> allocate;
  // Throws AllocationError with the reason the kubelet shows; the container does not start.
  std::function<void(const std::vector<std::string>& ids)> pre_start;
  bool pre_start_required = false;  // the kubelet must call pre_start before each container starts
};

inline constexpr const char* kKubeletSocket = "kubelet.sock";
inline constexpr const char* kDevicePluginVersion = "v1beta1";

class DevicePluginServer {
 public:
  DevicePluginServer(std::string resource, std::string directory, PluginCallbacks callbacks,
                     const ChangeSignal& signal);
  ~DevicePluginServer();
  DevicePluginServer(const DevicePluginServer&) = delete;
  DevicePluginServer& operator=(const DevicePluginServer&) = delete;

  // Creates the socket (replacing a stale one) and serves. Throws std::runtime_error.
  void start();
  // Stops serving (open streams end) and removes the socket.
  void stop();
  bool serving() const { return server_ != nullptr; }
  // Registers with the kubelet's socket in the directory; a failure says why.
  base::Status register_with_kubelet() const;

  const std::string& resource() const { return resource_; }
  std::string socket_path() const { return directory_ + "/" + socket_name_; }
  std::uint64_t allocations() const { return allocations_.load(); }
  std::uint64_t refusals() const { return refusals_.load(); }

  class Service;  // the gRPC service (plugin_server.cpp)

 private:
  std::string resource_, directory_, socket_name_;
  PluginCallbacks callbacks_;
  const ChangeSignal& signal_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> allocations_{0}, refusals_{0};
};

// The socket file name for a resource: tessera-<name after the '/'>.sock.
std::string socket_name_for(const std::string& resource);
// Whether a file name in the device-plugin directory is one socket_name_for gives.
bool is_device_plugin_socket_name(const std::string& name);

}  // namespace tessera::node
