// CDI specs (the Container Device Interface) for prepared claims: one file per claim in the CDI
// directory, read by the container runtime when a container names one of its devices. The
// claim-wide edits (the hook, its preload file, the claim's ledger, the limits' variables) go in
// the spec's containerEdits, applied with any of its devices; each device carries its own device
// nodes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "node/allocation.h"

namespace tessera::dra {

inline constexpr const char* kCdiVersion = "0.6.0";

struct CdiDevice {
  std::string name;  // unique in the spec
  std::vector<node::DeviceNodeSpec> device_nodes;
};

// The spec: `common`'s environment and mounts for every device, each device's nodes.
nlohmann::json cdi_spec(const node::ContainerAllocation& common,
                        const std::vector<CdiDevice>& devices);
// "<kind>=<name>", as a container (and NodePrepareResources' answer) names a CDI device.
std::string cdi_device_id(const std::string& name);
// The spec file of a claim in `directory`.
std::string cdi_spec_path(const std::string& directory, const std::string& claim_uid);

}  // namespace tessera::dra
