// Dynamic MIG on the node: the layout the tessera.io/mig-layout annotation asks for, read and
// checked, and applied to this machine's MIG GPUs without touching an instance a pod holds or
// a process uses. The planner (mig/planner.h) chooses the fewest steps; mig_gpu.h carries
// them out and undoes them on a failure.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>

#include "mig/planner.h"
#include "node/nvml.h"

namespace tessera::node {

// GPU index to the profile counts it should have.
using WantedMigLayout = std::map<unsigned, mig::ProfileCounts>;

// Reads the annotation's JSON. Throws std::invalid_argument saying what is wrong: not JSON,
// not an object of objects, a GPU that is no index, a count that is not 0 to 7, too much.
WantedMigLayout parse_mig_layout(const std::string& text);

// GPU instances that pods hold, as (GPU index, GPU instance ID).
using HeldInstances = std::set<std::pair<unsigned, unsigned>>;

// Changes each named GPU's instances to the wanted counts: every GPU is checked and planned
// first (MIG on, a MIG-capable GPU of this machine, the counts fit beside the instances in use
// or held), and nothing is touched unless all can be. Throws std::runtime_error naming the GPU
// and why; a GPU whose steps fail is rolled back (mig_gpu.h), and the GPUs changed before it
// are changed back. Returns what was done, for the log.
std::string apply_mig_layout(Nvml& nvml, const Inventory& inventory, const WantedMigLayout& wanted,
                             const HeldInstances& held);

}  // namespace tessera::node
