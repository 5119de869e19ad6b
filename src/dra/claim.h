// A ResourceClaim as NodePrepareResources reads it from the API server: the devices allocated to
// this driver on this node (with the capacity each consumes), and the opaque configs that apply
// to them. Everything is checked and bounded: the claim is outside input.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dra/sharing_config.h"

namespace tessera::dra {

struct ClaimError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the kubelet names a claim by.
struct ClaimRef {
  std::string name_space, uid, name;
  std::string label() const { return name_space + "/" + name; }
};

struct AllocatedDevice {
  std::string request, pool, device;
  std::optional<std::uint64_t> memory_bytes;  // consumed capacity, where the device shares
  std::optional<int> cores;
  std::string share_id;
  SharingConfig sharing;  // the configs that apply to its request, the last one winning
  bool operator==(const AllocatedDevice&) const = default;
};

// More than this many results, or configs, is not a claim a GPU node serves.
inline constexpr std::size_t kMostClaimDevices = 32;
inline constexpr std::size_t kMostClaimConfigs = 32;

// The devices of `claim` (a ResourceClaim object) allocated by `driver` from `pool`. Throws
// ClaimError naming the field at fault: not the claim asked for (another UID), not allocated,
// a device of this driver in another pool, too many devices, a malformed consumed capacity or
// config. Results of other drivers are skipped: they are theirs to prepare.
std::vector<AllocatedDevice> read_claim_allocation(const nlohmann::json& claim,
                                                   const ClaimRef& expected,
                                                   const std::string& driver,
                                                   const std::string& pool);

}  // namespace tessera::dra
