// mig-parted's config file, version v1, accepted unchanged (docs/mig.md): named configs,
// each a list of entries that say, for the GPUs they select (`devices`: all or indices,
// `device-filter`: PCI device IDs), whether MIG is on and which MIG devices to make.
// Refusals carry mig-parted's own messages, with the file and the entry.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/yaml_document.h"
#include "mig/planner.h"

namespace tessera::mig {

// A mig-parted config refused, naming the file, the field and the value.
using MigConfigError = base::DocumentError;

struct PartedEntry {
  std::vector<std::uint32_t> device_filter;  // packed device<<16|vendor; empty: any GPU
  bool all_devices = true;
  std::vector<int> devices;  // GPU indices when not all
  bool mig_enabled = false;
  ProfileCounts mig_devices;  // as written: "1g.10gb", "1g.5gb+me", ...
};

struct PartedConfig {
  std::map<std::string, std::vector<PartedEntry>> configs;
};

// Throws MigConfigError naming `origin` and what is wrong.
PartedConfig parse_parted_config(std::string_view text, const std::string& origin);

// The entry of a config that applies to GPU `index` with PCI device ID `device_id`, or null
// when none selects it. Throws MigConfigError when two do.
const PartedEntry* entry_for(const std::vector<PartedEntry>& entries, const std::string& config,
                             int index, std::uint32_t device_id);

// mig-parted's check of a profile's spelling ("1g.10gb", "1c.2g.10gb", "1g.5gb+me"); empty
// when it is well formed, else why not.
std::string profile_format_error(const std::string& profile);

}  // namespace tessera::mig
