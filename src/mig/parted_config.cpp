#include "mig/parted_config.h"

#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include "base/strings.h"

namespace tessera::mig {
namespace {

constexpr std::size_t kMostBytes = 1 << 20;  // mig-parted's own default config is 10 KiB
constexpr int kMostNesting = 32;

[[noreturn]] void refuse(const std::string& origin, const std::string& where,
                         const std::string& why) {
  throw MigConfigError(fmt::format("{}: {}{}", origin, where.empty() ? "" : where + ": ", why));
}

bool parse_number(std::string_view text, long long& value, int base = 10) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  return !text.empty() && error == std::errc() && end == text.data() + text.size();
}

// "<n><suffix>" as mig-parted's fields are: 1g, 10gb, 2c.
std::string field_error(const std::string& text, const char* suffix) {
  const std::string_view field(text);
  if (field.size() <= std::char_traits<char>::length(suffix) ||
      field.substr(field.size() - std::char_traits<char>::length(suffix)) != suffix) {
    return fmt::format("missing '{}' from '%d{}'", suffix, suffix);
  }
  long long value = 0;
  if (!parse_number(field.substr(0, field.size() - std::char_traits<char>::length(suffix)),
                    value) ||
      value < 0) {
    return fmt::format("malformed number in '%d{}'", suffix);
  }
  return {};
}

std::uint32_t device_id(const std::string& text, const std::string& origin,
                        const std::string& where) {
  // 0x20B210DE, optionally :0x<subsystem>; the subsystem is not told apart here.
  const std::string primary = text.substr(0, text.find(':'));
  long long value = 0;
  const bool hex =
      primary.size() > 2 && primary[0] == '0' && (primary[1] == 'x' || primary[1] == 'X');
  if (!(hex ? parse_number(std::string_view(primary).substr(2), value, 16)
            : parse_number(primary, value)) ||
      value < 0 || value > 0xFFFFFFFFll) {
    refuse(origin, where,
           fmt::format("unable to create DeviceID from string '{}'", text.substr(0, 100)));
  }
  return static_cast<std::uint32_t>(value);
}

PartedEntry read_entry(const YAML::Node& node, const std::string& origin,
                       const std::string& where) {
  if (!node.IsMap()) refuse(origin, where, "an entry must be a mapping");
  for (const char* required : {"devices", "mig-enabled"}) {
    if (!node[required]) refuse(origin, where, fmt::format("missing required field: {}", required));
  }
  PartedEntry entry;
  std::set<std::string> seen;
  for (const auto& field : node) {
    const std::string key = field.first.IsScalar() ? field.first.Scalar() : "";
    if (!seen.insert(key).second)
      refuse(origin, where, fmt::format("field {} is given twice", key));
    const YAML::Node& value = field.second;
    if (key == "device-filter") {
      if (value.IsScalar()) {
        entry.device_filter.push_back(device_id(value.Scalar(), origin, where + ".device-filter"));
      } else if (value.IsSequence()) {
        for (std::size_t i = 0; i < value.size() && i < 1024; ++i) {
          if (!value[i].IsScalar())
            refuse(origin, where + ".device-filter", "must be a string or a list of strings");
          entry.device_filter.push_back(
              device_id(value[i].Scalar(), origin, where + ".device-filter"));
        }
      } else {
        refuse(origin, where + ".device-filter", "must be a string or a list of strings");
      }
    } else if (key == "devices") {
      if (value.IsScalar() && !(value.Tag() == "?" && !value.Scalar().empty() &&
                                std::isdigit(static_cast<unsigned char>(value.Scalar()[0])))) {
        if (value.Scalar() != "all") {
          refuse(
              origin, where,
              fmt::format("invalid string input for 'devices': {}", value.Scalar().substr(0, 100)));
        }
        entry.all_devices = true;
      } else if (value.IsSequence()) {
        entry.all_devices = false;
        for (std::size_t i = 0; i < value.size(); ++i) {
          long long index = -1;
          if (!value[i].IsScalar() || value[i].Tag() != "?" ||
              !parse_number(value[i].Scalar(), index) || index < 0 || index > 1023) {
            refuse(origin, fmt::format("{}.devices[{}]", where, i), "must be a GPU index");
          }
          if (std::find(entry.devices.begin(), entry.devices.end(), index) != entry.devices.end()) {
            refuse(origin, fmt::format("{}.devices[{}]", where, i),
                   fmt::format("GPU {} is listed twice", index));
          }
          entry.devices.push_back(static_cast<int>(index));
        }
      } else {
        refuse(origin, where + ".devices", "must be 'all' or a list of GPU indices");
      }
    } else if (key == "mig-enabled") {
      if (!value.IsScalar() || value.Tag() != "?" ||
          (value.Scalar() != "true" && value.Scalar() != "false")) {
        refuse(origin, where + ".mig-enabled", "must be true or false");
      }
      entry.mig_enabled = value.Scalar() == "true";
    } else if (key == "mig-devices") {
      if (value.IsNull()) continue;
      if (!value.IsMap())
        refuse(origin, where + ".mig-devices", "must be a mapping of profiles to counts");
      for (const auto& device : value) {
        const std::string profile = device.first.IsScalar() ? device.first.Scalar() : "";
        if (const std::string error = profile_format_error(profile); !error.empty()) {
          refuse(origin, where,
                 fmt::format(
                     "error validating values in 'mig-devices' field: invalid format for '{}': {}",
                     profile.substr(0, 100), error));
        }
        long long count = -1;
        if (!device.second.IsScalar() || !parse_number(device.second.Scalar(), count) ||
            count < 0 || count > 64) {
          refuse(
              origin, where,
              fmt::format(
                  "error validating values in 'mig-devices' field: invalid count for '{}': {}",
                  profile, device.second.IsScalar() ? device.second.Scalar().substr(0, 40) : "?"));
        }
        if (entry.mig_devices.count(profile) > 0) {
          refuse(origin, where + ".mig-devices", fmt::format("{} is given twice", profile));
        }
        entry.mig_devices[profile] = static_cast<int>(count);
      }
    } else {
      refuse(origin, where, fmt::format("unexpected field: {}", key.substr(0, 100)));
    }
  }
  if (entry.mig_enabled && !node["mig-devices"]) {
    refuse(origin, where, "missing required field 'mig-devices' when 'mig-enabled' is true");
  }
  const bool any = std::any_of(entry.mig_devices.begin(), entry.mig_devices.end(),
                               [](const auto& device) { return device.second > 0; });
  if (!entry.mig_enabled && any)
    refuse(origin, where, "MIG devices included when 'mig-enabled' is false");
  return entry;
}

}  // namespace

std::string profile_format_error(const std::string& profile) {
  if (profile.empty()) return "empty MigProfile string";
  const std::size_t plus = profile.find('+');
  const std::string fields = profile.substr(0, plus);
  if (plus != std::string::npos) {
    std::set<std::string> unique;
    for (const std::string& attribute : base::split(profile.substr(plus + 1), ',')) {
      if (attribute.empty())
        return "error parsing attributes following '+' in MigProfile string: empty attribute in "
               "list";
      if (std::isdigit(static_cast<unsigned char>(attribute[0]))) {
        return "error parsing attributes following '+' in MigProfile string: attribute begins with "
               "a number";
      }
      if (!std::all_of(attribute.begin(), attribute.end(),
                       [](unsigned char c) { return std::isalnum(c) || c == '.'; })) {
        return "error parsing attributes following '+' in MigProfile string: non alpha-numeric "
               "character or digit in attribute";
      }
      if (!unique.insert(attribute).second) {
        return "error parsing attributes following '+' in MigProfile string: non unique attribute "
               "in list";
      }
    }
  }
  const std::vector<std::string> parts = base::split(fields, '.');
  std::string error;
  if (parts.size() == 3) {
    for (const auto& [part, suffix] :
         {std::pair<std::string, const char*>{parts[0], "c"}, {parts[1], "g"}, {parts[2], "gb"}}) {
      if (error.empty()) error = field_error(part, suffix);
    }
  } else if (parts.size() == 2) {
    error = field_error(parts[0], "g");
    if (error.empty()) {
      // Newer parts add a variant after the size ("1g.24gb-me"): the size must still lead it.
      const std::string size = parts[1].substr(0, parts[1].find('-'));
      error = field_error(size, "gb");
    }
  } else {
    error = "parsed wrong number of fields, expected 2 or 3";
  }
  return error.empty() ? "" : "error parsing '.' separated fields in MigProfile string: " + error;
}

PartedConfig parse_parted_config(std::string_view text, const std::string& origin) {
  const YAML::Node root = base::load_yaml(text, origin, kMostBytes, kMostNesting);
  PartedConfig config;
  if (!root.IsMap() || root.size() == 0)
    refuse(origin, "", "unable to parse with missing 'version' field");
  if (!root["version"]) refuse(origin, "", "unable to parse with missing 'version' field");
  const std::string version = root["version"].IsScalar() ? root["version"].Scalar() : "";
  if (version != "v1")
    refuse(origin, "version", fmt::format("unknown version: {}", version.substr(0, 100)));
  for (const auto& field : root) {
    const std::string key = field.first.IsScalar() ? field.first.Scalar() : "";
    if (key != "version" && key != "mig-configs")
      refuse(origin, "", fmt::format("unexpected field: {}", key.substr(0, 100)));
  }
  const YAML::Node configs = root["mig-configs"];
  if (!configs) return config;
  if (!configs.IsMap() || configs.size() == 0) {
    refuse(origin, "mig-configs", "at least one entry in 'mig-configs' is required");
  }
  int visited = 0;
  for (const auto& named : configs) {
    const std::string name = named.first.IsScalar() ? named.first.Scalar() : "";
    if (name.empty() || name.size() > 253) refuse(origin, "mig-configs", "a config without a name");
    if (config.configs.count(name) > 0) refuse(origin, "mig-configs." + name, "is given twice");
    const YAML::Node& entries = named.second;
    if (!entries.IsSequence() || entries.size() == 0) {
      refuse(origin, "mig-configs." + name,
             fmt::format("at least one entry in '{}' is required", name));
    }
    std::vector<PartedEntry>& list = config.configs[name];
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (++visited > 4096) refuse(origin, "mig-configs", "more than 4096 entries");
      list.push_back(read_entry(entries[i], origin, fmt::format("mig-configs.{}[{}]", name, i)));
    }
  }
  return config;
}

const PartedEntry* entry_for(const std::vector<PartedEntry>& entries, const std::string& config,
                             int index, std::uint32_t device_id) {
  const PartedEntry* found = nullptr;
  std::size_t found_at = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const PartedEntry& entry = entries[i];
    const bool filtered = entry.device_filter.empty() ||
                          std::find(entry.device_filter.begin(), entry.device_filter.end(),
                                    device_id) != entry.device_filter.end();
    const bool selected = entry.all_devices || std::find(entry.devices.begin(), entry.devices.end(),
                                                         index) != entry.devices.end();
    if (!filtered || !selected) continue;
    if (found != nullptr) {
      throw MigConfigError(fmt::format("config {}: GPU {} is selected by entries {} and {}", config,
                                       index, found_at, i));
    }
    found = &entry;
    found_at = i;
  }
  return found;
}

}  // namespace tessera::mig
