// The node agent's configuration: NVIDIA's device-plugin config, version v1, accepted
// unchanged (docs/configuration.md), plus Tessera's own `sharing.slices` for fractional GPUs.
//
// Read strictly: every field NVIDIA's schema has is accepted (those Tessera does not act on
// are named in `ignored`), anything else is refused, as are values of the wrong type or out
// of range and contradictions. Every refusal names the file, the field and the value, and
// carries NVIDIA's own message where NVIDIA has one.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/yaml_document.h"

namespace tessera::node {

// A config refused, naming the file, the field and the value.
using ConfigError = base::DocumentError;

enum class MigStrategy { none, single, mixed };
enum class DeviceIdStrategy { uuid, index };
enum class SharingStrategy { none, time_slicing, mps, slices };

const char* mig_strategy_name(MigStrategy strategy);
const char* sharing_strategy_name(SharingStrategy strategy);  // as GFD's label says it
const char* sharing_label(SharingStrategy strategy);  // nvidia.com/gpu.sharing (docs/kubernetes.md)

// Which GPUs a shared resource covers: all of them, the first `count`, or a list of GPU
// indices, MIG indices ("0:1") and UUIDs (GPU-..., MIG-...).
struct DeviceSelection {
  enum class Kind { all, count, list } kind = Kind::all;
  int count = 0;
  std::vector<std::string> refs;
};

// One resource copied `replicas` times per device (time-slicing, MPS) or cut into `replicas`
// slices per GPU with enforced limits (slices).
struct SharedResource {
  std::string name;    // nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...
  std::string rename;  // empty: not renamed (renameByDefault may still apply)
  DeviceSelection devices;
  int replicas = 0;
  // Slices only: what a slice gets when no scheduler assignment says otherwise.
  std::uint64_t memory_per_slice = 0;  // bytes; 0: the GPU's memory / replicas
  int cores_per_slice = 0;             // percent; 0: no compute cap
};

struct SharedResources {
  bool rename_by_default = false;
  bool fail_requests_greater_than_one = false;
  // Slices only: also advertise every sliced GPU's memory as gpushare's aliyun.com/gpu-mem,
  // one device per GiB, for gpushare's pods (docs/kubernetes.md, migrating from gpushare).
  bool gpushare = false;
  std::vector<SharedResource> resources;
  bool present = false;  // the section was in the file
};

struct DeviceListStrategies {
  bool envvar = true;
  bool volume_mounts = false;
  bool cdi_annotations = false;
  bool cdi_cri = false;
};

struct Flags {
  MigStrategy mig_strategy = MigStrategy::none;
  bool fail_on_init_error = true;
  std::string mps_root;
  std::string nvidia_driver_root = "/";
  std::string nvidia_dev_root;  // empty: the driver root
  bool gds_enabled = false;
  bool mofed_enabled = false;
  bool pass_device_specs = false;
  DeviceListStrategies device_list;
  DeviceIdStrategy device_id = DeviceIdStrategy::uuid;
  std::string cdi_annotation_prefix = "cdi.k8s.io/";
  bool gfd_no_timestamp = false;
  std::chrono::seconds gfd_sleep_interval{60};
  // Tessera's: the GPUs' time slice to set (nvidia-smi compute-policy: 0 default, 1 short,
  // 2 medium, 3 long); -1 leaves it as it is.
  int compute_timeslice = -1;
};

// Which device events make a GPU unhealthy: NVIDIA's `health` section and defaults. The
// DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS variables adjust them (node/health.h).
struct HealthSettings {
  bool configured = false;  // the config has a health section
  bool disabled = false;
  bool xid_events = true;      // XID critical errors
  bool double_bit_ecc = true;  // uncorrectable memory errors
  bool single_bit_ecc = true;  // corrected ones: counted, never unhealthy
  // Application errors (the GPU is fine): NVIDIA's list.
  std::set<std::uint64_t> ignored_xids = {13, 31, 43, 45, 68, 109};
  bool all_critical = true;  // else only critical_xids
  std::set<std::uint64_t> critical_xids;
  bool operator==(const HealthSettings&) const = default;
};

struct PluginConfig {
  std::string name;    // the config's name (a ConfigMap key), or "default"
  std::string origin;  // the file it came from, for messages
  std::string text;    // as read: tells an edited config from the same one read again
  Flags flags;
  SharedResources time_slicing, mps, slices;
  HealthSettings health;
  std::vector<std::string> ignored;  // fields accepted but not acted on, for the log

  SharingStrategy strategy() const;
  // The section of the active strategy (time-slicing or MPS; slices are their own).
  const SharedResources& replicated() const { return mps.present ? mps : time_slicing; }
};

// The most a config file may hold: NVIDIA's examples are a few hundred bytes.
inline constexpr std::size_t kMostConfigBytes = 256 << 10;

// Parses one config (YAML or JSON). Throws ConfigError naming `origin`, the field and value.
PluginConfig parse_plugin_config(std::string_view text, const std::string& origin,
                                 const std::string& name = "default");

// The config NVIDIA's plugin runs with when given none: whole GPUs, no sharing.
PluginConfig default_plugin_config();

// Named configs, as a ConfigMap mounted as a directory has them (one file per key; names
// starting with '.' are the kubelet's bookkeeping) or a single file (named by its stem).
struct ConfigSet {
  std::map<std::string, PluginConfig> configs;
  std::map<std::string, std::string> refused;  // name -> why
};
ConfigSet read_config_directory(const std::string& directory);
// What a config source (a directory, a file, or both) holds now, to tell an edit from a
// spurious file event: names and contents, each cut at kMostConfigBytes. Never throws.
std::string config_source_fingerprint(const std::string& directory, const std::string& file);
ConfigSet read_config_file(const std::string& path, const std::string& name);

// Which config a node runs: the one its label names, else `fallback` (the --config flag),
// else the only one there is, else NVIDIA's default. Throws ConfigError when a named config
// is missing or was refused, saying which and why.
struct ConfigChoice {
  std::string label;     // nvidia.com/device-plugin.config on the node; empty: none
  std::string fallback;  // --config
};
PluginConfig choose_config(const ConfigSet& set, const ConfigChoice& choice);

}  // namespace tessera::node
