// The GPUs' time slice between contexts, as `nvidia-smi compute-policy --set-timeslice` sets it,
// on nodes whose config asks (flags.computeTimeslice). A device runs one context's work until
// its slice ends or it runs out, so the slice bounds how long high-priority work waits behind
// a long kernel already running (docs/compute.md). Never touched unless the config names it.
#pragma once

#include <functional>
#include <string>

#include "base/log.h"
#include "node/nvml.h"

namespace tessera::node {

// Sets `timeslice` (0 default, 1 short, 2 medium, 3 long) on every GPU of the inventory by
// running `nvidia_smi` (looked up on PATH without a '/'); says what happened through `report`.
// Returns whether every GPU took it.
bool apply_compute_timeslice(const std::string& nvidia_smi, const Inventory& inventory,
                             int timeslice, const base::Reporter& report);

// "default", "short", "medium" or "long".
const char* timeslice_name(int timeslice);

}  // namespace tessera::node
