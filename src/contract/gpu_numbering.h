// The scheduler's numbering of a node's GPUs, the one rule both sides use: the node agent
// lists every GPU it serves in its tessera.io/gpus annotation, in its own order, each with how
// it is shared; the scheduler numbers, from 0, only those it places pods on (GPUs served whole,
// or cut into slices), in the annotation's order. A pod's tessera.io/assignment names GPUs by
// that number (and by UUID); the node agent maps the number back with the same rule.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::contract {

// How the annotation says a GPU is shared.
inline constexpr std::string_view kSharingNone = "none";  // whole GPUs
inline constexpr std::string_view kSharingSlices = "slices";
inline constexpr std::string_view kSharingTimeSlicing = "timeslice";
inline constexpr std::string_view kSharingMps = "mps";
inline constexpr std::string_view kSharingMig = "mig";

// Whether the scheduler places pods on, and numbers, a GPU shared so.
bool scheduler_numbers(std::string_view sharing);

// The UUIDs of the annotation's GPUs (its "gpus" list) in the scheduler's numbering. An entry
// without a string "sharing" and "uuid" is not numbered.
std::vector<std::string> scheduler_numbering(const nlohmann::json& gpu_list);

}  // namespace tessera::contract
