// Planning MIG layouts against a GPU model's placement rules, before anything is touched:
// where each GPU instance goes, why a layout cannot fit and which nearby ones can, and the
// fewest destroy and create steps from the layout a GPU has to the one wanted.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "mig/catalog.h"

namespace tessera::mig {

// A GPU instance: its profile and where it starts, in memory slices.
struct Instance {
  const Profile* profile = nullptr;
  int start = 0;
  bool operator==(const Instance& other) const {
    return profile == other.profile && start == other.start;
  }
};
using Layout = std::vector<Instance>;

// How many instances of each profile, by name: what mig-parted's `mig-devices` says.
using ProfileCounts = std::map<std::string, int>;

// Whether `layout` is one the GPU accepts: legal starts, no overlap, no profile beyond its
// most, the compute slices the GPU has. If not, `why` says which rule it breaks.
bool legal(const GpuModel& model, const Layout& layout, std::string* why = nullptr);

struct Plan {
  bool found = false;
  Layout layout;                       // `fixed` first, then the new instances
  std::string why;                     // when not found
  std::vector<ProfileCounts> nearest;  // when not found: the largest parts of the request that fit
};
// A legal placement of `wanted` beside the instances in `fixed` (which stay where they are).
// Finds one whenever one exists (a complete search). Unknown profiles are refused by name.
Plan place(const GpuModel& model, const ProfileCounts& wanted, const Layout& fixed = {});

// A GPU instance that exists, as the planner needs to know it.
struct Existing {
  Instance instance;
  unsigned id = 0;      // its GPU instance ID
  bool in_use = false;  // processes run on it
};
struct Step {
  enum class Kind { destroy, create } kind = Kind::create;
  Instance instance;
  unsigned id = 0;  // the instance destroyed
};
struct Reconciliation {
  bool ok = false;
  std::string why;
  std::vector<Step> steps;  // destroys first, then creates
  Layout result;            // the layout when the steps are done
};
// From the instances a GPU has to `wanted`: keeps as many as it can (so the fewest are
// destroyed and created), never destroys one in use unless `force`.
Reconciliation reconcile(const GpuModel& model, const std::vector<Existing>& current,
                         const ProfileCounts& wanted, bool force);

// The layout as a picture of the memory slices, one row per GPU:
//   |3g.40gb                |2g.20gb    |1g.10gb|  free |
std::string picture(const GpuModel& model, const Layout& layout);

// The counts of a layout's profiles.
ProfileCounts counts_of(const Layout& layout);
// Counts for people: "3g.40gb x1 + 1g.10gb x3", or "nothing".
std::string counts_text(const ProfileCounts& counts);

}  // namespace tessera::mig
