// JSON from outside (request bodies, watch events, annotations, API server answers), parsed
// with bounds: nlohmann's parser keeps its own stack, but copying and walking a value recurse,
// so a body nested a hundred thousand deep would overflow the stack later. Nesting beyond
// kMostJsonDepth is refused while parsing, before such a value exists.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tessera::kube {

inline constexpr int kMostJsonDepth = 64;  // Kubernetes objects nest about 12 deep

// Throws std::runtime_error saying why: not JSON, or nested too deep.
nlohmann::json parse_outside_json(std::string_view text);

// The string at `pointer` in `object`, or "" where there is none or it is not a string.
std::string string_at(const nlohmann::json& object, const nlohmann::json::json_pointer& pointer);

// Serialises a value holding strings from outside: bytes that are not UTF-8 become U+FFFD
// instead of throwing.
std::string dump_outside_json(const nlohmann::json& value);

}  // namespace tessera::kube
