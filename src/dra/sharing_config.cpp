#include "dra/sharing_config.h"

#include <fmt/core.h>

#include <set>

#include "contract/dra.h"
#include "kube/quantity.h"

namespace tessera::dra {
namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw DraConfigError(fmt::format("{}: {}", field, why));
}

std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', true, json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

// Refuses any member of `object` not in `known`.
void only_fields(const json& object, const std::string& where, const std::set<std::string>& known) {
  if (!object.is_object()) refuse(where, fmt::format("must be an object, not {}", shown(object)));
  for (const auto& [name, value] : object.items()) {
    if (!known.contains(name)) {
      refuse(where.empty() ? name : where + "." + name, "unknown field");
    }
  }
}

std::string string_field(const json& object, const std::string& where, const char* name) {
  const json& value = object.at(name);
  if (!value.is_string())
    refuse(where + name, fmt::format("must be a string, not {}", shown(value)));
  return value.get<std::string>();
}

SharingConfig::Strategy strategy_named(const std::string& field, const std::string& name,
                                       bool nvidia) {
  if (name == "TimeSlicing") return SharingConfig::Strategy::time_slicing;
  if (name == "MPS") return SharingConfig::Strategy::mps;
  if (name == "Limits" && !nvidia) return SharingConfig::Strategy::limits;
  refuse(field, fmt::format("'{}' is not one of {}", name,
                            nvidia ? "TimeSlicing, MPS" : "Limits, TimeSlicing, MPS"));
}

std::string interval(const json& section, const std::string& where) {
  only_fields(section, where, {"interval"});
  if (!section.contains("interval")) return "Default";
  const std::string value = string_field(section, where + ".", "interval");
  if (value != "Default" && value != "Short" && value != "Medium" && value != "Long") {
    refuse(where + ".interval",
           fmt::format("'{}' is not one of Default, Short, Medium, Long", value));
  }
  return value;
}

int percentage(const json& section, const std::string& field, const char* name) {
  const json& value = section.at(name);
  if (!value.is_number_integer() || value.get<std::int64_t>() < 1 ||
      value.get<std::int64_t>() > 100) {
    refuse(field, fmt::format("must be a whole number from 1 to 100, not {}", shown(value)));
  }
  return value.get<int>();
}

std::uint64_t memory_bytes(const json& value, const std::string& field) {
  std::int64_t mib = 0;
  if (!value.is_string() || !kube::parse_memory_mib(value.get<std::string>(), mib) || mib <= 0) {
    refuse(field, fmt::format("must be a memory quantity such as 10Gi, not {}", shown(value)));
  }
  return static_cast<std::uint64_t>(mib) << 20;
}

void read_mps(SharingConfig& config, const json& section, const std::string& where,
              const char* threads, const char* pinned) {
  if (section.contains(threads)) {
    config.mps_thread_percentage = percentage(section, where + "." + threads, threads);
  }
  if (section.contains(pinned)) {
    config.mps_pinned_memory_bytes = memory_bytes(section.at(pinned), where + "." + pinned);
  }
}

SharingConfig read_tessera(const json& parameters) {
  only_fields(parameters, "",
              {"apiVersion", "kind", "strategy", "priority", "burst", "timeSlicing", "mps"});
  SharingConfig config;
  if (parameters.contains("strategy")) {
    config.strategy = strategy_named("strategy", string_field(parameters, "", "strategy"), false);
  }
  if (parameters.contains("priority")) {
    const std::string name = string_field(parameters, "", "priority");
    if (name == "high") {
      config.priority = Priority::high;
    } else if (name == "low") {
      config.priority = Priority::low;
    } else if (name != "none") {
      refuse("priority", fmt::format("'{}' is not one of high, low, none", name));
    }
  }
  if (parameters.contains("burst")) {
    if (!parameters["burst"].is_boolean()) {
      refuse("burst", fmt::format("must be true or false, not {}", shown(parameters["burst"])));
    }
    config.burst = parameters["burst"].get<bool>();
    if (config.burst && config.strategy != SharingConfig::Strategy::limits) {
      refuse("burst", fmt::format("bursting beyond a share needs strategy Limits, not {}",
                                  strategy_name(config.strategy)));
    }
  }
  if (parameters.contains("timeSlicing")) {
    if (config.strategy != SharingConfig::Strategy::time_slicing) {
      refuse("timeSlicing", fmt::format("is given with strategy {}, not TimeSlicing",
                                        strategy_name(config.strategy)));
    }
    config.interval = interval(parameters["timeSlicing"], "timeSlicing");
  }
  if (parameters.contains("mps")) {
    if (config.strategy != SharingConfig::Strategy::mps) {
      refuse("mps",
             fmt::format("is given with strategy {}, not MPS", strategy_name(config.strategy)));
    }
    only_fields(parameters["mps"], "mps", {"activeThreadPercentage", "pinnedMemoryLimit"});
    read_mps(config, parameters["mps"], "mps", "activeThreadPercentage", "pinnedMemoryLimit");
  }
  if (config.strategy == SharingConfig::Strategy::time_slicing && config.interval.empty()) {
    config.interval = "Default";
  }
  return config;
}

SharingConfig read_nvidia(const json& parameters) {
  only_fields(parameters, "", {"apiVersion", "kind", "sharing"});
  SharingConfig config;
  if (!parameters.contains("sharing")) return config;  // a whole GPU, nothing shared
  const json& sharing = parameters["sharing"];
  only_fields(sharing, "sharing", {"strategy", "timeSlicingConfig", "mpsConfig"});
  if (!sharing.contains("strategy")) refuse("sharing.strategy", "is required");
  config.strategy =
      strategy_named("sharing.strategy", string_field(sharing, "sharing.", "strategy"), true);
  if (sharing.contains("timeSlicingConfig")) {
    if (config.strategy != SharingConfig::Strategy::time_slicing) {
      refuse("sharing.timeSlicingConfig", "is given with strategy MPS");
    }
    config.interval = interval(sharing["timeSlicingConfig"], "sharing.timeSlicingConfig");
  }
  if (config.strategy == SharingConfig::Strategy::time_slicing && config.interval.empty()) {
    config.interval = "Default";
  }
  if (sharing.contains("mpsConfig")) {
    if (config.strategy != SharingConfig::Strategy::mps) {
      refuse("sharing.mpsConfig", "is given with strategy TimeSlicing");
    }
    const json& mps = sharing["mpsConfig"];
    only_fields(mps, "sharing.mpsConfig",
                {"defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit",
                 "defaultPerDevicePinnedMemoryLimit"});
    read_mps(config, mps, "sharing.mpsConfig", "defaultActiveThreadPercentage",
             "defaultPinnedDeviceMemoryLimit");
    if (mps.contains("defaultPerDevicePinnedMemoryLimit")) {
      // Keyed by the GPU's index or UUID on NVIDIA's node: a claim's limits here are per
      // device already, so a map that would say otherwise is refused rather than half-read.
      const json& limits = mps["defaultPerDevicePinnedMemoryLimit"];
      if (!limits.is_object() || !limits.empty()) {
        refuse("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit",
               "per-device limits are not supported; use defaultPinnedDeviceMemoryLimit");
      }
    }
  }
  return config;
}

}  // namespace

const char* strategy_name(SharingConfig::Strategy strategy) {
  switch (strategy) {
    case SharingConfig::Strategy::limits:
      return "Limits";
    case SharingConfig::Strategy::time_slicing:
      return "TimeSlicing";
    case SharingConfig::Strategy::mps:
      return "MPS";
  }
  return "?";
}

SharingConfig parse_sharing_config(const json& parameters) {
  if (!parameters.is_object()) {
    refuse("parameters", fmt::format("must be an object, not {}", shown(parameters)));
  }
  if (!parameters.contains("apiVersion")) refuse("apiVersion", "is required");
  if (!parameters.contains("kind")) refuse("kind", "is required");
  const std::string api_version = string_field(parameters, "", "apiVersion");
  const std::string kind = string_field(parameters, "", "kind");
  if (api_version == contract::kDraConfigApiVersion) {
    if (kind != contract::kDraConfigKind) {
      refuse("kind", fmt::format("'{}' is not {}", kind, contract::kDraConfigKind));
    }
    return read_tessera(parameters);
  }
  if (api_version == contract::kNvidiaDraConfigApiVersion) {
    if (kind != "GpuConfig" && kind != "MigDeviceConfig") {
      refuse("kind", fmt::format("'{}' is not GpuConfig or MigDeviceConfig", kind));
    }
    return read_nvidia(parameters);
  }
  refuse("apiVersion",
         fmt::format("'{}' is not {} or {}", api_version, contract::kDraConfigApiVersion,
                     contract::kNvidiaDraConfigApiVersion));
}

}  // namespace tessera::dra
