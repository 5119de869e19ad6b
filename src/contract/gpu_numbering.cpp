#include "contract/gpu_numbering.h"

namespace tessera::contract {

bool scheduler_numbers(std::string_view sharing) {
  return sharing == kSharingNone || sharing == kSharingSlices;
}

std::vector<std::string> scheduler_numbering(const nlohmann::json& gpu_list) {
  std::vector<std::string> uuids;
  if (!gpu_list.is_array()) return uuids;
  for (const nlohmann::json& gpu : gpu_list) {
    if (!gpu.is_object()) continue;
    const auto sharing = gpu.find("sharing");
    const auto uuid = gpu.find("uuid");
    if (sharing == gpu.end() || !sharing->is_string() || uuid == gpu.end() || !uuid->is_string())
      continue;
    if (scheduler_numbers(sharing->get_ref<const std::string&>())) {
      uuids.push_back(uuid->get<std::string>());
    }
  }
  return uuids;
}

}  // namespace tessera::contract
