#include "dra/claim.h"

#include <fmt/core.h>

#include <algorithm>

#include "kube/json_input.h"
#include "kube/quantity.h"

namespace tessera::dra {
namespace {

using nlohmann::json;

constexpr std::size_t kMostNameBytes = 253;  // a DNS subdomain: every name here is one or less

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw ClaimError(fmt::format("{}: {}", field, why));
}

const json& member(const json& object, const char* name, const std::string& where) {
  if (!object.is_object() || !object.contains(name)) refuse(where + "." + name, "is missing");
  return object.at(name);
}

std::string name_at(const json& object, const char* name, const std::string& where) {
  const json& value = member(object, name, where);
  if (!value.is_string() || value.get_ref<const std::string&>().empty() ||
      value.get_ref<const std::string&>().size() > kMostNameBytes) {
    refuse(where + "." + name, "must be a name of 1 to 253 characters");
  }
  return value.get<std::string>();
}

const json& array_at(const json& object, const char* name, const std::string& where,
                     std::size_t most) {
  static const json kEmpty = json::array();
  if (!object.contains(name)) return kEmpty;
  const json& value = object.at(name);
  if (!value.is_array()) refuse(where + "." + name, "must be a list");
  if (value.size() > most) {
    refuse(where + "." + name,
           fmt::format("has {} entries; at most {} are served", value.size(), most));
  }
  return value;
}

void read_consumed(AllocatedDevice& device, const json& result, const std::string& where) {
  if (!result.contains("consumedCapacity")) return;
  const json& consumed = result.at("consumedCapacity");
  const std::string field = where + ".consumedCapacity";
  if (!consumed.is_object()) refuse(field, "must be an object");
  for (const auto& [name, value] : consumed.items()) {
    if (!value.is_string()) refuse(field + "." + name, "must be a quantity");
    const std::string& text = value.get_ref<const std::string&>();
    if (name == "memory") {
      std::int64_t mib = 0;
      if (!kube::parse_memory_mib(text, mib) || mib <= 0) {
        refuse(field + ".memory", fmt::format("'{}' is not a memory quantity", text.substr(0, 64)));
      }
      device.memory_bytes = static_cast<std::uint64_t>(mib) << 20;
    } else if (name == "cores") {
      std::int64_t cores = 0;
      if (!kube::parse_count(text, cores) || cores < 1 || cores > 100) {
        refuse(field + ".cores",
               fmt::format("'{}' is not a share from 1 to 100", text.substr(0, 64)));
      }
      device.cores = static_cast<int>(cores);
    } else {
      refuse(field + "." + name.substr(0, 64), "is not a capacity this driver publishes");
    }
  }
}

}  // namespace

std::vector<AllocatedDevice> read_claim_allocation(const json& claim, const ClaimRef& expected,
                                                   const std::string& driver,
                                                   const std::string& pool) {
  if (!claim.is_object()) refuse("claim", "is not an object");
  const json& metadata = member(claim, "metadata", "claim");
  if (kube::string_at(metadata, json::json_pointer("/uid")) != expected.uid) {
    refuse("metadata.uid", fmt::format("the claim {} is no longer the one with UID {}",
                                       expected.label(), expected.uid));
  }
  const json* allocation = nullptr;
  if (claim.contains("status") && claim["status"].is_object() &&
      claim["status"].contains("allocation")) {
    allocation = &claim["status"]["allocation"];
  }
  if (allocation == nullptr || !allocation->is_object()) {
    refuse("status.allocation", "the claim is not allocated");
  }
  const json& devices = member(*allocation, "devices", "status.allocation");
  if (!devices.is_object()) refuse("status.allocation.devices", "must be an object");
  const std::string where = "status.allocation.devices";

  // The configs that are this driver's, in order, each with the requests it applies to.
  struct Config {
    std::vector<std::string> requests;  // empty: every request
    SharingConfig sharing;
  };
  std::vector<Config> configs;
  const json& config_list = array_at(devices, "config", where, kMostClaimConfigs);
  for (std::size_t i = 0; i < config_list.size(); ++i) {
    const std::string at = fmt::format("{}.config[{}]", where, i);
    const json& entry = config_list[i];
    if (!entry.is_object()) refuse(at, "must be an object");
    if (!entry.contains("opaque")) continue;  // not opaque: nothing for a driver
    const json& opaque = entry["opaque"];
    if (name_at(opaque, "driver", at + ".opaque") != driver) continue;
    Config config;
    for (const json& request : array_at(entry, "requests", at, kMostClaimDevices)) {
      if (!request.is_string()) refuse(at + ".requests", "must list names");
      config.requests.push_back(request.get<std::string>());
    }
    try {
      config.sharing = parse_sharing_config(member(opaque, "parameters", at + ".opaque"));
    } catch (const DraConfigError& refused) {
      throw ClaimError(fmt::format("{}.opaque.parameters.{}", at, refused.what()));
    }
    configs.push_back(std::move(config));
  }

  std::vector<AllocatedDevice> mine;
  const json& results = array_at(devices, "results", where, kMostClaimDevices);
  for (std::size_t i = 0; i < results.size(); ++i) {
    const std::string at = fmt::format("{}.results[{}]", where, i);
    const json& result = results[i];
    if (!result.is_object()) refuse(at, "must be an object");
    if (name_at(result, "driver", at) != driver) continue;
    AllocatedDevice device;
    device.request = name_at(result, "request", at);
    device.pool = name_at(result, "pool", at);
    device.device = name_at(result, "device", at);
    if (device.pool != pool) {
      refuse(at + ".pool", fmt::format("'{}' is not this node's pool '{}'", device.pool, pool));
    }
    device.share_id = kube::string_at(result, json::json_pointer("/shareID"));
    read_consumed(device, result, at);
    // A request of a subrequest ("gpu/shared") takes the configs of its parent too.
    const std::string parent = device.request.substr(0, device.request.find('/'));
    for (const Config& config : configs) {
      if (config.requests.empty() ||
          std::find_if(config.requests.begin(), config.requests.end(), [&](const std::string& r) {
            return r == device.request || r == parent;
          }) != config.requests.end()) {
        device.sharing = config.sharing;
      }
    }
    mine.push_back(std::move(device));
  }
  if (mine.empty()) refuse(where + ".results", fmt::format("no device of {} is allocated", driver));
  return mine;
}

}  // namespace tessera::dra
