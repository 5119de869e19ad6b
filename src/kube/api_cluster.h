// The Cluster facade over the API server's REST paths: the one place in Tessera that knows
// them. Names come from objects the API server gave or from flags, and are escaped all the
// same: a name with '/' or '?' must not turn into another path.
#pragma once

#include "kube/api_client.h"
#include "kube/cluster.h"

namespace tessera::kube {

class ApiCluster final : public Cluster {
 public:
  explicit ApiCluster(ApiClientOptions options) : client_(std::move(options)) {}

  ApiResponse get_node(const std::string& name, Deadline deadline) const override;
  ApiResponse patch_node(const std::string& name, const nlohmann::json& patch,
                         Deadline deadline) const override;
  ApiResponse get_pod(const ObjectName& pod, Deadline deadline) const override;
  ApiResponse patch_pod(const ObjectName& pod, const nlohmann::json& patch,
                        Deadline deadline) const override;
  ApiResponse bind_pod(const ObjectName& pod, const std::string& uid, const std::string& node,
                       Deadline deadline) const override;
  ApiResponse list(const Collection& collection, Deadline deadline) const override;
  ApiResponse watch(const Collection& collection, const std::string& version,
                    const std::function<bool(const std::string&)>& on_event,
                    const std::atomic<bool>& stop, int idle_seconds) const override;
  ApiResponse get_lease(const ObjectName& lease, Deadline deadline) const override;
  ApiResponse create_lease(const ObjectName& lease, const nlohmann::json& object,
                           Deadline deadline) const override;
  ApiResponse replace_lease(const ObjectName& lease, const nlohmann::json& object,
                            Deadline deadline) const override;
  ApiResponse get_resource_claim(const ObjectName& claim, Deadline deadline) const override;
  ApiResponse list_resource_slices(const std::string& driver, const std::string& node,
                                   Deadline deadline) const override;
  ApiResponse create_resource_slice(const nlohmann::json& object, Deadline deadline) const override;
  ApiResponse replace_resource_slice(const std::string& name, const nlohmann::json& object,
                                     Deadline deadline) const override;
  ApiResponse delete_resource_slice(const std::string& name, Deadline deadline) const override;

 private:
  ApiClient client_;
};

}  // namespace tessera::kube
