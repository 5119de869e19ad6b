// YAML documents (manifests, the seeds' examples) as the JSON the API server would hold them
// in: numbers and booleans typed, quoted scalars kept as strings. Header-only: its users link
// yaml-cpp themselves.
#pragma once

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

namespace tessera::test {

inline nlohmann::json to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) object[entry.first.as<std::string>()] = to_json(entry.second);
      return object;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& item : node) list.push_back(to_json(item));
      return list;
    }
    case YAML::NodeType::Scalar: {
      const std::string text = node.Scalar();
      int number = 0;
      if (node.Tag() != "!" && YAML::convert<int>::decode(node, number)) return number;
      if (text == "true" || text == "false") return text == "true";
      return text;
    }
    default:
      return nullptr;
  }
}

}  // namespace tessera::test
