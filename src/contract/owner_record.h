// The owner record: what the node agent knows of a container it gave GPUs with a ledger, kept
// beside (never inside) the directory mounted into the container, so the container cannot
// rewrite who it is. Written at Allocate with what the kubelet said (the resource and device
// IDs), completed at PreStartContainer with the pod and container the kubelet's pod-resources
// API names as their holder. The agent's metrics and its clean-up read it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::contract {

struct OwnerRecord {
  std::string resource;                 // the kubelet's resource name
  std::vector<std::string> device_ids;  // as the kubelet allocated them, sorted
  std::vector<int> gpus;                // inventory indices, as the container's 0, 1, ...
  std::uint64_t sequence = 0;           // this node's allocation order: the newest holds the IDs
  // Known once the holder is (at PreStartContainer, or at Allocate without a cluster):
  std::string pod_namespace, pod_name, pod_uid, container;
  bool limits_written = false;  // the ledger holds the container's limits
  bool operator==(const OwnerRecord&) const = default;
};

nlohmann::json owner_record_json(const OwnerRecord& record);
// Throws std::runtime_error naming the field at fault.
OwnerRecord owner_record_from_json(const nlohmann::json& json);

// Replaces the file at `path` at once (a temporary renamed into place).
base::Status write_owner_record(const std::string& path, const OwnerRecord& record);
// The record at `path`, in `record`; a failure if it is missing, too large or not a record.
base::Status read_owner_record(const std::string& path, OwnerRecord& record);

}  // namespace tessera::contract
