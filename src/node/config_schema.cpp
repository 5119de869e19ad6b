// NVIDIA's device-plugin config schema (v1), read strictly, with Tessera's additions (slices,
// health): every refusal names the file, the field and the value.
#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <initializer_list>
#include <set>

#include "base/strings.h"
#include "common/units.h"
#include "contract/annotations.h"
#include "kube/objects.h"
#include "node/config.h"

namespace tessera::node {
namespace {

using Reader = base::YamlReader;

constexpr std::size_t kMostResourceNameLength = 63;  // NVIDIA's, for the qualified name
constexpr int kMostReplicas = 1024;                  // far beyond any GPU's share count
constexpr int kMostFlowNesting = 32;                 // a config nests about 6 deep

// NVIDIA's NewResourceName: a name without the nvidia.com/ prefix gets it.
std::string resource_name(Reader& reader, const YAML::Node& node, const std::string& path) {
  std::string name = reader.text(node, path);
  if (name.rfind("nvidia.com/", 0) != 0) name = "nvidia.com/" + name;
  if (name.size() > kMostResourceNameLength) {
    reader.fail(path, fmt::format("fully-qualified resource name must be {} characters or less: {}",
                                  kMostResourceNameLength, name));
  }
  if (!kube::dns_name(name.substr(name.find('/') + 1), 253, true)) {
    reader.fail(path, fmt::format("incorrect format for resource name '{}': not a lowercase "
                                  "DNS subdomain (a-z, 0-9, '-', '.')",
                                  name));
  }
  return name;
}

bool gpu_index(const std::string& text) {
  return !text.empty() && text.size() <= 4 &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool hex_uuid(std::string_view text) {  // xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
  if (text.size() != 36) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? text[i] != '-' : !std::isxdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

// What NVIDIA's ReplicaDeviceRef accepts: a GPU index, a MIG index, a GPU or MIG UUID.
bool device_reference(const std::string& text) {
  if (gpu_index(text)) return true;
  if (const std::size_t colon = text.find(':'); colon != std::string::npos) {
    return gpu_index(text.substr(0, colon)) && gpu_index(text.substr(colon + 1));
  }
  if (text.rfind("GPU-", 0) == 0) return hex_uuid(std::string_view(text).substr(4));
  if (text.rfind("MIG-", 0) == 0) {
    const std::string_view rest = std::string_view(text).substr(4);
    if (hex_uuid(rest)) return true;
    // MIG-GPU-<uuid>/<gi>/<ci>
    const std::size_t first = rest.find('/');
    if (first == std::string_view::npos || rest.substr(0, 4) != "GPU-" ||
        !hex_uuid(rest.substr(4, first - 4))) {
      return false;
    }
    const std::size_t second = rest.find('/', first + 1);
    return second != std::string_view::npos &&
           gpu_index(std::string(rest.substr(first + 1, second - first - 1))) &&
           gpu_index(std::string(rest.substr(second + 1)));
  }
  return false;
}

DeviceSelection device_selection(Reader& reader, const YAML::Node& node, const std::string& path) {
  DeviceSelection selection;
  reader.visit(path);
  if (node.IsScalar()) {
    const std::string& text = node.Scalar();
    const bool number =
        node.Tag() == "?" && !text.empty() &&
        (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-' || text[0] == '+');
    if (number) {
      const std::int64_t count = reader.integer(node, path, INT64_MIN, INT64_MAX);
      if (count <= 0) {
        reader.fail(path,
                    fmt::format("devices set as '{}' but a count of devices must be > 0", count));
      }
      selection.kind = DeviceSelection::Kind::count;
      selection.count = static_cast<int>(std::min<std::int64_t>(count, 1 << 20));
      return selection;
    }
    if (text != "all") {
      reader.fail(path, fmt::format("devices set as '{}' but the only valid string input is 'all'",
                                    text.substr(0, 200)));
    }
    return selection;
  }
  if (!node.IsSequence()) reader.fail(path, "unrecognized type for devices spec: a mapping");
  selection.kind = DeviceSelection::Kind::list;
  std::set<std::string> seen;
  for (std::size_t i = 0; i < node.size(); ++i) {
    const std::string where = Reader::item(path, i);
    reader.visit(where);
    if (!node[i].IsScalar() || !device_reference(node[i].Scalar())) {
      reader.fail(where, fmt::format("unsupported type for device in devices list: {} (a GPU "
                                     "index, a MIG index such as 0:1, or a GPU-/MIG- UUID)",
                                     Reader::shown(node[i])));
    }
    if (!seen.insert(node[i].Scalar()).second) {
      reader.fail(where, fmt::format("device {} is listed twice", node[i].Scalar()));
    }
    selection.refs.push_back(node[i].Scalar());
  }
  return selection;
}

SharedResource shared_resource(Reader& reader, const YAML::Node& node, const std::string& path,
                               bool slices) {
  reader.expect_map(node, path);
  if (slices) {
    reader.check_keys(node, path,
                      {"name", "rename", "devices", "replicas", "memoryPerSlice", "coresPerSlice"});
  } else {
    reader.check_keys(node, path, {"name", "rename", "devices", "replicas"});
  }
  SharedResource resource;
  if (!node["name"]) reader.fail(path, "no resource name specified");
  resource.name = resource_name(reader, node["name"], Reader::join(path, "name"));
  if (node["rename"] && !node["rename"].IsNull()) {
    resource.rename = resource_name(reader, node["rename"], Reader::join(path, "rename"));
  }
  if (node["devices"]) {
    resource.devices = device_selection(reader, node["devices"], Reader::join(path, "devices"));
  }
  if (!node["replicas"]) reader.fail(path, "no replicas specified");
  const std::string replicas_path = Reader::join(path, "replicas");
  const std::int64_t replicas =
      reader.integer(node["replicas"], replicas_path, INT64_MIN, INT64_MAX);
  if (slices ? replicas < 1 : replicas < 2) {
    reader.fail(replicas_path, fmt::format("number of replicas must be >= {} (replicas: {})",
                                           slices ? 1 : 2, replicas));
  }
  if (replicas > kMostReplicas) {
    reader.fail(replicas_path,
                fmt::format("{} replicas is more than {} per device", replicas, kMostReplicas));
  }
  resource.replicas = static_cast<int>(replicas);
  if (slices && node["memoryPerSlice"]) {
    const std::string where = Reader::join(path, "memoryPerSlice");
    reader.visit(where);
    const std::string size =
        node["memoryPerSlice"].IsScalar() ? node["memoryPerSlice"].Scalar() : std::string();
    if (!parse_size(size, resource.memory_per_slice) || resource.memory_per_slice == 0) {
      reader.fail(where, fmt::format("{} is not a size larger than 0 (write e.g. 8GiB or 512MiB)",
                                     Reader::shown(node["memoryPerSlice"])));
    }
  }
  if (slices && node["coresPerSlice"]) {
    resource.cores_per_slice = static_cast<int>(
        reader.integer(node["coresPerSlice"], Reader::join(path, "coresPerSlice"), 1, 100));
  }
  return resource;
}

SharedResources shared_resources(Reader& reader, const YAML::Node& node, const std::string& path,
                                 bool slices) {
  SharedResources section;
  if (reader.is_absent(node)) return section;
  reader.expect_map(node, path);
  if (slices) {
    reader.check_keys(node, path,
                      {"renameByDefault", "failRequestsGreaterThanOne", "gpushare", "resources"});
  } else {
    reader.check_keys(node, path, {"renameByDefault", "failRequestsGreaterThanOne", "resources"});
  }
  section.present = true;
  if (slices && node["gpushare"]) {
    section.gpushare = reader.boolean(node["gpushare"], Reader::join(path, "gpushare"));
  }
  if (node["renameByDefault"]) {
    section.rename_by_default =
        reader.boolean(node["renameByDefault"], Reader::join(path, "renameByDefault"));
  }
  if (node["failRequestsGreaterThanOne"]) {
    section.fail_requests_greater_than_one = reader.boolean(
        node["failRequestsGreaterThanOne"], Reader::join(path, "failRequestsGreaterThanOne"));
  }
  const std::string resources_path = Reader::join(path, "resources");
  const YAML::Node resources = node["resources"];
  if (reader.is_absent(resources)) reader.fail(path, "no resources specified");
  if (!resources.IsSequence()) reader.fail(resources_path, "must be a list");
  if (resources.size() == 0) reader.fail(resources_path, "no resources specified");
  std::set<std::string> names;
  for (std::size_t i = 0; i < resources.size(); ++i) {
    section.resources.push_back(
        shared_resource(reader, resources[i], Reader::item(resources_path, i), slices));
    if (!names.insert(section.resources.back().name).second) {
      reader.fail(Reader::item(resources_path, i),
                  fmt::format("resource {} is listed twice", section.resources.back().name));
    }
  }
  return section;
}

// One strategy or a list of them.
void read_device_list_strategy(Reader& reader, const YAML::Node& node, const std::string& path,
                               DeviceListStrategies& strategies) {
  reader.visit(path);
  const std::size_t count = node.IsSequence() ? node.size() : 1;
  if (count == 0) {
    reader.fail(path,
                "invalid --device-list-strategy option: no device list strategy specified; at "
                "least one of [envvar volume-mounts cdi-annotations cdi-cri] is required");
  }
  strategies = DeviceListStrategies{false, false, false, false};
  for (std::size_t i = 0; i < count; ++i) {
    bool* chosen = reader.choice<bool*>(
        node.IsSequence() ? node[i] : node, node.IsSequence() ? Reader::item(path, i) : path,
        {{"envvar", &strategies.envvar},
         {"volume-mounts", &strategies.volume_mounts},
         {"cdi-annotations", &strategies.cdi_annotations},
         {"cdi-cri", &strategies.cdi_cri}},
        "invalid --device-list-strategy option: invalid strategy: ");
    *chosen = true;
  }
}

// A Go duration as GFD's sleepInterval takes it: "60s", "1m30s", "500ms".
std::chrono::seconds duration(Reader& reader, const YAML::Node& node, const std::string& path) {
  const std::string text = reader.text(node, path);
  double total = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = at;
    while (end < text.size() &&
           (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.'))
      ++end;
    double number = 0;
    const auto [stop, error] = std::from_chars(text.data() + at, text.data() + end, number);
    std::size_t unit_end = end;
    while (unit_end < text.size() && std::isalpha(static_cast<unsigned char>(text[unit_end])))
      ++unit_end;
    const std::string unit = text.substr(end, unit_end - end);
    const double scale = unit == "h"    ? 3600
                         : unit == "m"  ? 60
                         : unit == "s"  ? 1
                         : unit == "ms" ? 1e-3
                                        : -1;
    if (end == at || error != std::errc() || stop != text.data() + end || scale < 0) {
      reader.fail(path, fmt::format("'{}' is not a duration (write e.g. 60s or 1m30s)",
                                    text.substr(0, 200)));
    }
    total += number * scale;
    at = unit_end;
  }
  if (text.empty() || total < 1 || total > 86400) {
    reader.fail(path, fmt::format("'{}' must be a duration from 1s to 24h", text.substr(0, 200)));
  }
  return std::chrono::seconds(static_cast<std::int64_t>(total));
}

void read_flags(Reader& reader, const YAML::Node& node, Flags& flags, PluginConfig& config) {
  if (reader.is_absent(node)) return;
  reader.expect_map(node, "flags");
  reader.check_keys(
      node, "flags",
      {"migStrategy", "failOnInitError", "mpsRoot", "nvidiaDriverRoot", "nvidiaDevRoot",
       "gdsEnabled", "mofedEnabled", "gdrcopyEnabled", "useNodeFeatureAPI",
       "deviceDiscoveryStrategy", "restartOnDeviceUnhealthy", "plugin", "gfd", "computeTimeslice"});
  auto ignore = [&](const char* name) {
    if (node[name]) config.ignored.push_back(std::string("flags.") + name);
  };
  if (node["migStrategy"] && !node["migStrategy"].IsNull()) {
    flags.mig_strategy = reader.choice<MigStrategy>(node["migStrategy"], "flags.migStrategy",
                                                    {{"none", MigStrategy::none},
                                                     {"single", MigStrategy::single},
                                                     {"mixed", MigStrategy::mixed}},
                                                    "invalid --mig-strategy option: ");
  }
  if (node["computeTimeslice"] && !node["computeTimeslice"].IsNull()) {
    flags.compute_timeslice = reader.choice<int>(
        node["computeTimeslice"], "flags.computeTimeslice",
        {{"default", 0}, {"short", 1}, {"medium", 2}, {"long", 3}}, "invalid time slice: ");
  }
  if (node["failOnInitError"] && !node["failOnInitError"].IsNull()) {
    flags.fail_on_init_error = reader.boolean(node["failOnInitError"], "flags.failOnInitError");
  }
  if (node["mpsRoot"] && !node["mpsRoot"].IsNull()) {
    flags.mps_root = reader.text(node["mpsRoot"], "flags.mpsRoot");
  }
  if (node["nvidiaDriverRoot"] && !node["nvidiaDriverRoot"].IsNull()) {
    flags.nvidia_driver_root = reader.text(node["nvidiaDriverRoot"], "flags.nvidiaDriverRoot");
  }
  if (node["nvidiaDevRoot"] && !node["nvidiaDevRoot"].IsNull()) {
    flags.nvidia_dev_root = reader.text(node["nvidiaDevRoot"], "flags.nvidiaDevRoot");
  }
  if (node["gdsEnabled"] && !node["gdsEnabled"].IsNull()) {
    flags.gds_enabled = reader.boolean(node["gdsEnabled"], "flags.gdsEnabled");
  }
  if (node["mofedEnabled"] && !node["mofedEnabled"].IsNull()) {
    flags.mofed_enabled = reader.boolean(node["mofedEnabled"], "flags.mofedEnabled");
  }
  for (const char* name : {"gdrcopyEnabled", "useNodeFeatureAPI", "restartOnDeviceUnhealthy"}) {
    if (node[name] && !node[name].IsNull())
      reader.boolean(node[name], std::string("flags.") + name);
    ignore(name);
  }
  if (node["deviceDiscoveryStrategy"] && !node["deviceDiscoveryStrategy"].IsNull()) {
    reader.choice<int>(node["deviceDiscoveryStrategy"], "flags.deviceDiscoveryStrategy",
                       {{"auto", 0}, {"nvml", 0}, {"tegra", 0}, {"wsl", 0}},
                       "invalid device discovery strategy: ");
    ignore("deviceDiscoveryStrategy");
  }
  if (const YAML::Node plugin = node["plugin"]; !reader.is_absent(plugin)) {
    reader.expect_map(plugin, "flags.plugin");
    reader.check_keys(
        plugin, "flags.plugin",
        {"passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy", "cdiAnnotationPrefix",
         "nvidiaCTKPath", "nvidiaCDIHookPath", "containerDriverRoot", "driverRootCtrPath"});
    if (plugin["passDeviceSpecs"] && !plugin["passDeviceSpecs"].IsNull()) {
      flags.pass_device_specs =
          reader.boolean(plugin["passDeviceSpecs"], "flags.plugin.passDeviceSpecs");
    }
    if (plugin["deviceListStrategy"] && !plugin["deviceListStrategy"].IsNull()) {
      read_device_list_strategy(reader, plugin["deviceListStrategy"],
                                "flags.plugin.deviceListStrategy", flags.device_list);
    }
    if (plugin["deviceIDStrategy"] && !plugin["deviceIDStrategy"].IsNull()) {
      flags.device_id = reader.choice<DeviceIdStrategy>(
          plugin["deviceIDStrategy"], "flags.plugin.deviceIDStrategy",
          {{"uuid", DeviceIdStrategy::uuid}, {"index", DeviceIdStrategy::index}},
          "invalid --device-id-strategy option: ");
    }
    if (plugin["cdiAnnotationPrefix"] && !plugin["cdiAnnotationPrefix"].IsNull()) {
      flags.cdi_annotation_prefix =
          reader.text(plugin["cdiAnnotationPrefix"], "flags.plugin.cdiAnnotationPrefix");
    }
    for (const char* name :
         {"nvidiaCTKPath", "nvidiaCDIHookPath", "containerDriverRoot", "driverRootCtrPath"}) {
      if (plugin[name] && !plugin[name].IsNull()) {
        reader.text(plugin[name], std::string("flags.plugin.") + name);
        config.ignored.push_back(std::string("flags.plugin.") + name);
      }
    }
  }
  if (const YAML::Node gfd = node["gfd"]; !reader.is_absent(gfd)) {
    reader.expect_map(gfd, "flags.gfd");
    reader.check_keys(gfd, "flags.gfd",
                      {"oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile"});
    if (gfd["noTimestamp"] && !gfd["noTimestamp"].IsNull()) {
      flags.gfd_no_timestamp = reader.boolean(gfd["noTimestamp"], "flags.gfd.noTimestamp");
    }
    if (gfd["sleepInterval"] && !gfd["sleepInterval"].IsNull()) {
      flags.gfd_sleep_interval = duration(reader, gfd["sleepInterval"], "flags.gfd.sleepInterval");
    }
    if (gfd["oneshot"] && !gfd["oneshot"].IsNull()) {
      reader.boolean(gfd["oneshot"], "flags.gfd.oneshot");
      config.ignored.push_back("flags.gfd.oneshot");
    }
    for (const char* name : {"outputFile", "machineTypeFile"}) {
      if (gfd[name] && !gfd[name].IsNull()) {
        reader.text(gfd[name], std::string("flags.gfd.") + name);
        config.ignored.push_back(std::string("flags.gfd.") + name);
      }
    }
  }
}

// `resources:` renames resources by pattern in NVIDIA's schema; NVIDIA's plugin itself
// ignores it ("not yet supported"), and so does Tessera, after checking its shape.
void read_resources_section(Reader& reader, const YAML::Node& node, PluginConfig& config) {
  if (reader.is_absent(node)) return;
  reader.expect_map(node, "resources");
  reader.check_keys(node, "resources", {"gpus", "mig", "migs"});
  for (const char* kind : {"gpus", "mig", "migs"}) {
    const YAML::Node list = node[kind];
    if (reader.is_absent(list)) continue;
    const std::string path = std::string("resources.") + kind;
    if (!list.IsSequence()) reader.fail(path, "must be a list");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = Reader::item(path, i);
      reader.expect_map(list[i], where);
      reader.check_keys(list[i], where, {"pattern", "name"});
      if (!list[i]["pattern"]) reader.fail(where, "resources must have a 'pattern' field set");
      if (!list[i]["name"]) reader.fail(where, "resources must have a 'name' field set");
      reader.text(list[i]["pattern"], Reader::join(where, "pattern"));
      resource_name(reader, list[i]["name"], Reader::join(where, "name"));
    }
  }
  config.ignored.push_back("resources (NVIDIA's plugin ignores it too)");
}

void read_imex(Reader& reader, const YAML::Node& node, PluginConfig& config) {
  if (reader.is_absent(node)) return;
  reader.expect_map(node, "imex");
  reader.check_keys(node, "imex", {"channelIDs", "required"});
  if (const YAML::Node ids = node["channelIDs"]; !reader.is_absent(ids)) {
    if (!ids.IsSequence()) reader.fail("imex.channelIDs", "must be a list of channel numbers");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      reader.integer(ids[i], Reader::item("imex.channelIDs", i), 0, 2047);
    }
  }
  if (node["required"] && !node["required"].IsNull())
    reader.boolean(node["required"], "imex.required");
  config.ignored.push_back("imex");
}

void read_health(Reader& reader, const YAML::Node& node, PluginConfig& config) {
  if (reader.is_absent(node)) return;
  reader.expect_map(node, "health");
  reader.check_keys(node, "health", {"disabled", "eventTypes", "ignoredXIDs", "criticalXIDs"});
  HealthSettings& health = config.health;
  health.configured = true;
  if (node["disabled"] && !node["disabled"].IsNull()) {
    health.disabled = reader.boolean(node["disabled"], "health.disabled");
  }
  if (const YAML::Node types = node["eventTypes"]; !reader.is_absent(types)) {
    if (!types.IsSequence()) reader.fail("health.eventTypes", "must be a list");
    health.xid_events = health.double_bit_ecc = health.single_bit_ecc = false;
    for (std::size_t i = 0; i < types.size(); ++i) {
      bool* watched = reader.choice<bool*>(types[i], Reader::item("health.eventTypes", i),
                                           {{"EventTypeXidCriticalError", &health.xid_events},
                                            {"EventTypeDoubleBitEccError", &health.double_bit_ecc},
                                            {"EventTypeSingleBitEccError", &health.single_bit_ecc}},
                                           "invalid event type: ");
      *watched = true;
    }
  }
  if (const YAML::Node ignored = node["ignoredXIDs"]; !reader.is_absent(ignored)) {
    if (!ignored.IsSequence()) reader.fail("health.ignoredXIDs", "must be a list of XIDs");
    health.ignored_xids.clear();
    for (std::size_t i = 0; i < ignored.size(); ++i) {
      health.ignored_xids.insert(static_cast<std::uint64_t>(
          reader.integer(ignored[i], Reader::item("health.ignoredXIDs", i), 0, 1 << 20)));
    }
  }
  if (const YAML::Node critical = node["criticalXIDs"]; !reader.is_absent(critical)) {
    if (critical.IsScalar()) {
      const std::string text = base::lower(critical.Scalar());
      if (text != "all") {
        reader.fail("health.criticalXIDs",
                    fmt::format("invalid string value for criticalXIDs: {}", text.substr(0, 200)));
      }
      health.all_critical = true;
      health.critical_xids.clear();
    } else if (critical.IsSequence()) {
      health.all_critical = false;
      for (std::size_t i = 0; i < critical.size(); ++i) {
        const auto xid = static_cast<std::uint64_t>(
            reader.integer(critical[i], Reader::item("health.criticalXIDs", i), 0, 1 << 20));
        if (health.ignored_xids.count(xid) > 0) {
          reader.fail("health.criticalXIDs",
                      fmt::format("XID {} is in both ignored and critical lists", xid));
        }
        health.critical_xids.insert(xid);
      }
    } else {
      reader.fail("health.criticalXIDs",
                  "criticalXIDs must be either \"all\" or an array of numbers");
    }
  }
}

}  // namespace

const char* mig_strategy_name(MigStrategy strategy) {
  switch (strategy) {
    case MigStrategy::single:
      return "single";
    case MigStrategy::mixed:
      return "mixed";
    default:
      return "none";
  }
}

namespace {

// Each sharing strategy in GFD's words (nvidia.com/gpu.sharing-strategy) and in the GPU-sharing
// guide's label (nvidia.com/gpu.sharing); both in docs/kubernetes.md.
struct SharingNames {
  SharingStrategy strategy;
  const char* gfd;
  const char* guide;
};
constexpr SharingNames kSharingNames[] = {
    {SharingStrategy::none, "none", "none"},
    {SharingStrategy::time_slicing, "time-slicing", "timeslice"},
    {SharingStrategy::mps, "mps", "mps"},
    {SharingStrategy::slices, "slices", "slices"},
};

const SharingNames& sharing_names(SharingStrategy strategy) {
  for (const SharingNames& names : kSharingNames) {
    if (names.strategy == strategy) return names;
  }
  return kSharingNames[0];
}

}  // namespace

const char* sharing_strategy_name(SharingStrategy strategy) {
  return sharing_names(strategy).gfd;
}

const char* sharing_label(SharingStrategy strategy) {
  return sharing_names(strategy).guide;
}

SharingStrategy PluginConfig::strategy() const {
  if (mps.present) return SharingStrategy::mps;
  if (time_slicing.present) return SharingStrategy::time_slicing;
  if (slices.present) return SharingStrategy::slices;
  return SharingStrategy::none;
}

PluginConfig parse_plugin_config(std::string_view text, const std::string& origin,
                                 const std::string& name) {
  const YAML::Node root = base::load_yaml(text, origin, kMostConfigBytes, kMostFlowNesting);
  Reader reader(origin);
  PluginConfig config = default_plugin_config();
  config.name = name;
  config.origin = origin;
  config.text = std::string(text);
  if (reader.is_absent(root)) return config;  // an empty file is the default config
  reader.expect_map(root, "");
  reader.check_keys(root, "", {"version", "flags", "resources", "sharing", "imex", "health"});
  if (root["version"] && !root["version"].IsNull()) {
    const std::string version = reader.text(root["version"], "version");
    if (!version.empty() && version != "v1") {
      reader.fail("version", fmt::format("unknown version: {}", version.substr(0, 200)));
    }
  }
  read_flags(reader, root["flags"], config.flags, config);
  read_resources_section(reader, root["resources"], config);
  read_imex(reader, root["imex"], config);
  read_health(reader, root["health"], config);
  if (const YAML::Node sharing = root["sharing"]; !reader.is_absent(sharing)) {
    reader.expect_map(sharing, "sharing");
    // `mig.strategy` under sharing is how the GPU-sharing guide writes flags.migStrategy
    // (docs/configuration.md).
    reader.check_keys(sharing, "sharing", {"timeSlicing", "mps", "slices", "mig"});
    config.time_slicing =
        shared_resources(reader, sharing["timeSlicing"], "sharing.timeSlicing", false);
    config.mps = shared_resources(reader, sharing["mps"], "sharing.mps", false);
    config.slices = shared_resources(reader, sharing["slices"], "sharing.slices", true);
    if (config.mps.present && !sharing["mps"]["failRequestsGreaterThanOne"]) {
      config.mps.fail_requests_greater_than_one = true;  // NVIDIA's default for MPS
    }
    if (const YAML::Node mig = sharing["mig"]; !reader.is_absent(mig)) {
      reader.expect_map(mig, "sharing.mig");
      reader.check_keys(mig, "sharing.mig", {"strategy"});
      if (mig["strategy"] && !mig["strategy"].IsNull()) {
        const MigStrategy flag_strategy = config.flags.mig_strategy;
        const bool flag_given =
            root["flags"] && root["flags"]["migStrategy"] && !root["flags"]["migStrategy"].IsNull();
        YAML::Node as_flags;
        as_flags["migStrategy"] = mig["strategy"];
        Flags alias;
        read_flags(reader, as_flags, alias, config);
        if (flag_given && alias.mig_strategy != flag_strategy) {
          reader.fail("sharing.mig.strategy", fmt::format("'{}' contradicts flags.migStrategy '{}'",
                                                          mig_strategy_name(alias.mig_strategy),
                                                          mig_strategy_name(flag_strategy)));
        }
        config.flags.mig_strategy = alias.mig_strategy;
      }
    }
  }
  // Contradictions NVIDIA's plugin would resolve silently, or refuse at start.
  if (config.mps.present && config.time_slicing.present) {
    reader.fail("sharing", "timeSlicing and mps are both set; a node shares its GPUs one way");
  }
  // One resource may be cut into slices on some GPUs and time-sliced on others, each section
  // naming its GPUs; not both on the same ones (then the second finds them taken).
  if (config.slices.present && (config.mps.present || config.time_slicing.present)) {
    for (const SharedResource& slice : config.slices.resources) {
      for (const SharedResource& other : config.replicated().resources) {
        const bool listed = slice.devices.kind == DeviceSelection::Kind::list &&
                            other.devices.kind == DeviceSelection::Kind::list;
        if (slice.name == other.name && !listed) {
          reader.fail("sharing.slices",
                      fmt::format("{} is also shared by {}; a resource is shared one way",
                                  slice.name, config.mps.present ? "mps" : "timeSlicing"));
        }
      }
    }
  }
  if (config.mps.present) {
    if (config.flags.mig_strategy == MigStrategy::mixed) {
      reader.fail("flags.migStrategy", "using --mig-strategy=mixed is not supported with MPS");
    }
    if (config.flags.mps_root.empty()) {
      reader.fail("flags.mpsRoot", "using MPS requires --mps-root to be specified");
    }
  }
  if (config.flags.nvidia_dev_root.empty())
    config.flags.nvidia_dev_root = config.flags.nvidia_driver_root;
  return config;
}

PluginConfig default_plugin_config() {
  PluginConfig config;
  config.name = "default";
  config.origin = "(built-in default)";
  config.flags.nvidia_dev_root = config.flags.nvidia_driver_root;
  return config;
}

}  // namespace tessera::node
