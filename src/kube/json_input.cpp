#include "kube/json_input.h"

#include <fmt/core.h>

#include <stdexcept>

namespace tessera::kube {

nlohmann::json parse_outside_json(std::string_view text) {
  try {
    return nlohmann::json::parse(
        text.begin(), text.end(),
        [](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
          if (event == nlohmann::json::parse_event_t::object_start ||
              event == nlohmann::json::parse_event_t::array_start) {
            if (depth >= kMostJsonDepth) {
              throw std::runtime_error(
                  fmt::format("JSON nested deeper than {} levels is refused", kMostJsonDepth));
            }
          }
          return true;
        });
  } catch (const nlohmann::json::exception& error) {  // one kind of error for every caller
    throw std::runtime_error(error.what());
  }
}

std::string string_at(const nlohmann::json& object, const nlohmann::json::json_pointer& pointer) {
  if (!object.contains(pointer)) return {};
  const nlohmann::json& value = object[pointer];
  return value.is_string() ? value.get<std::string>() : std::string();
}

std::string dump_outside_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tessera::kube
