#include "dra/cdi.h"

#include <fmt/core.h>

#include <algorithm>

#include "contract/dra.h"

namespace tessera::dra {

using nlohmann::json;

json cdi_spec(const node::ContainerAllocation& common, const std::vector<CdiDevice>& devices) {
  json env = json::array();
  for (const auto& [name, value] : common.envs) env.push_back(name + "=" + value);
  json mounts = json::array();
  for (const node::MountSpec& mount : common.mounts) {
    mounts.push_back(
        {{"hostPath", mount.host_path},
         {"containerPath", mount.container_path},
         {"options", json::array({mount.read_only ? "ro" : "rw", "nosuid", "nodev", "rbind"})}});
  }
  json device_list = json::array();
  for (const CdiDevice& device : devices) {
    json nodes = json::array();
    for (const node::DeviceNodeSpec& node : device.device_nodes) {
      nodes.push_back({{"path", node.container_path},
                       {"hostPath", node.host_path},
                       {"permissions", node.permissions}});
    }
    device_list.push_back({{"name", device.name}, {"containerEdits", {{"deviceNodes", nodes}}}});
  }
  return {{"cdiVersion", kCdiVersion},
          {"kind", contract::kCdiKind},
          {"devices", device_list},
          {"containerEdits", {{"env", env}, {"mounts", mounts}}}};
}

std::string cdi_device_id(const std::string& name) {
  return fmt::format("{}={}", contract::kCdiKind, name);
}

std::string cdi_spec_path(const std::string& directory, const std::string& claim_uid) {
  std::string kind = contract::kCdiKind;
  std::replace(kind.begin(), kind.end(), '/', '_');
  return fmt::format("{}/{}-{}.json", directory, kind, claim_uid);
}

}  // namespace tessera::dra
