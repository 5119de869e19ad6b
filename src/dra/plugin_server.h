// The DRA kubelet plugin over gRPC: the registration service (pluginregistration v1, type
// DRAPlugin) on <registry>/<driver>-reg.sock, which the kubelet finds by watching the
// directory, and the DRAPlugin service, v1 and v1beta1, on <plugins>/<driver>/dra.sock. Every
// claim of a request gets its own answer; a claim's failure is its own.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "base/log.h"
#include "dra/driver.h"

namespace grpc {
class Server;
}

namespace tessera::dra {

inline constexpr const char* kDraPluginType = "DRAPlugin";
// More claims than this in one request is not a kubelet's: refused whole.
inline constexpr int kMostClaimsPerRequest = 1024;

class DraPluginServer {
 public:
  DraPluginServer(std::string driver, std::string registry_dir, std::string plugins_dir,
                  DraDriver& driver_impl, base::Reporter report);
  ~DraPluginServer();
  DraPluginServer(const DraPluginServer&) = delete;
  DraPluginServer& operator=(const DraPluginServer&) = delete;

  // Makes the directories and sockets (replacing stale ones) and serves. Throws
  // std::runtime_error.
  void start();
  // Stops serving and removes both sockets: the kubelet unregisters the plugin.
  void stop();

  std::string registration_socket() const;
  std::string plugin_socket() const;
  // Whether the kubelet said it took the plugin.
  bool registered() const { return registered_.load(); }

  class Services;  // plugin_server.cpp

 private:
  std::string driver_, registry_dir_, plugins_dir_;
  DraDriver& driver_impl_;
  base::Reporter report_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> registration_server_, plugin_server_;
  std::atomic<bool> registered_{false};
};

}  // namespace tessera::dra
