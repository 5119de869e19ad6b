// The limit variables a container or a `tessera run` group is given, in Tessera's form and
// HAMi's, written through common/limits.h's one formatter so the hook's one parser reads them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::contract {

// Per device, by the process's ordinal: bytes (0: none) and percent of the device's time
// (0: none). Returns each variable and its value; none for a kind with no limit at all.
std::map<std::string, std::string> limit_variables(const std::vector<std::uint64_t>& memory_bytes,
                                                   const std::vector<int>& core_percent);

}  // namespace tessera::contract
