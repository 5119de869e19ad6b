// mig-parted's config files, as anyone may write them: whatever the bytes, reading gives a
// checked config or a MigConfigError, and every layout an accepted config asks for is placed
// legally on each GPU model, or refused with a reason, within bounds of time.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_input.h"
#include "mig/parted_config.h"
#include "mig/planner.h"

using namespace tessera::mig;
using tessera::fuzz::broken;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  PartedConfig config;
  try {
    config =
        parse_parted_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const MigConfigError&) {
    return 0;
  }
  int placed = 0;
  for (const auto& [name, entries] : config.configs) {
    if (entries.empty()) broken("a config without entries");
    for (const PartedEntry& entry : entries) {
      if (!entry.mig_enabled) {
        for (const auto& [profile, count] : entry.mig_devices) {
          if (count > 0) broken("MIG devices accepted with MIG off");
        }
        continue;
      }
      for (const auto& [profile, count] : entry.mig_devices) {
        if (count < 0 || count > 64) broken("a count out of range");
        if (!profile_format_error(profile).empty()) broken("a malformed profile accepted");
      }
      if (++placed > 64) return 0;  // bounded work per input
      for (const GpuModel& model : builtin_catalog()) {
        const Plan plan = place(model, entry.mig_devices);
        if (plan.found) {
          if (!legal(model, plan.layout)) broken("an illegal layout placed");
          if (counts_of(plan.layout) != [&] {
                ProfileCounts wanted;
                for (const auto& [profile, count] : entry.mig_devices) {
                  if (count > 0) wanted[profile] = count;
                }
                return wanted;
              }()) {
            broken("a layout of other profiles than asked");
          }
        } else if (plan.why.empty()) {
          broken("a refusal without a reason");
        }
      }
    }
  }
  return 0;
}
