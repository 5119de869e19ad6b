#include "base/yaml_document.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <set>

#include "base/strings.h"

namespace tessera::base {
namespace {

// Whether `text` nests YAML or JSON flow collections ([ and {, outside quotes) deeper than
// `limit`: parsers that recurse (yaml-cpp) must be refused such input before they see it.
bool nests_deeper_than(std::string_view text, int limit) {
  int depth = 0;
  char quote = 0;
  for (const char c : text) {
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if ((c == '[' || c == '{') && ++depth > limit) {
      return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

bool looks_boolean(const std::string& text) {
  static const std::set<std::string> words = {"true", "false", "yes", "no", "on", "off", "y", "n"};
  return words.count(lower(text)) > 0;
}

bool parse_integer(const std::string& text, std::int64_t& value) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') ++begin;
  const auto [stop, error] = std::from_chars(begin, end, value);
  return begin != end && error == std::errc() && stop == end;
}

bool looks_numeric(const std::string& text) {
  std::int64_t ignored = 0;
  if (parse_integer(text, ignored)) return true;
  double number = 0;
  const auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  return !text.empty() && error == std::errc() && stop == text.data() + text.size();
}

}  // namespace

YAML::Node load_yaml(std::string_view text, const std::string& origin, std::size_t most_bytes,
                     int most_nesting) {
  if (text.size() > most_bytes) {
    throw DocumentError(fmt::format("{}: larger than {} KiB", origin, most_bytes >> 10));
  }
  if (nests_deeper_than(text, most_nesting)) {
    throw DocumentError(fmt::format("{}: nested more than {} deep", origin, most_nesting));
  }
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& error) {
    throw DocumentError(fmt::format("{}: not YAML: {}", origin, error.what()));
  }
}

std::string read_file_bounded(const std::string& path, std::size_t most) {
  std::ifstream input(path, std::ios::binary);
  if (!input) throw DocumentError(fmt::format("{}: cannot be read", path));
  std::string text(most + 1, '\0');
  input.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(input.gcount()));
  if (text.size() > most)
    throw DocumentError(fmt::format("{}: larger than {} KiB", path, most >> 10));
  return text;
}

void YamlReader::fail(const std::string& path, const std::string& why) const {
  throw DocumentError(fmt::format("{}: {}: {}", origin_, path.empty() ? "(top)" : path, why));
}

void YamlReader::visit(const std::string& path) {
  if (++visited_ > kMostNodesVisited) fail(path, "the config is too large a tree");
}

void YamlReader::expect_map(const YAML::Node& node, const std::string& path) {
  visit(path);
  if (!node.IsMap()) fail(path, fmt::format("must be a mapping, not {}", describe(node)));
}

void YamlReader::check_keys(const YAML::Node& node, const std::string& path,
                            std::initializer_list<const char*> known) {
  std::set<std::string> seen;
  for (const auto& entry : node) {
    visit(path);
    if (!entry.first.IsScalar()) fail(path, "has a key that is not a plain name");
    const std::string key = entry.first.Scalar();
    if (!seen.insert(key).second) fail(join(path, key), "is given twice");
    if (std::find_if(known.begin(), known.end(), [&](const char* name) { return key == name; }) ==
        known.end()) {
      std::string names;
      for (const char* name : known) names += (names.empty() ? "" : ", ") + std::string(name);
      fail(join(path, key), fmt::format("unknown field (known here: {})", names));
    }
  }
}

std::string YamlReader::text(const YAML::Node& node, const std::string& path) {
  visit(path);
  if (!node.IsScalar()) fail(path, fmt::format("must be a string, not {}", describe(node)));
  // Go's YAML turns a plain 12 or true into a number or a boolean, which a string refuses.
  if (node.Tag() == "?" && (looks_numeric(node.Scalar()) || looks_boolean(node.Scalar()))) {
    fail(path, fmt::format("must be a string, not {} (quote it)", node.Scalar()));
  }
  return node.Scalar();
}

bool YamlReader::boolean(const YAML::Node& node, const std::string& path) {
  visit(path);
  if (!node.IsScalar() || node.Tag() != "?" || !looks_boolean(node.Scalar())) {
    fail(path, fmt::format("must be true or false, not {}", shown(node)));
  }
  const std::string value = lower(node.Scalar());
  return value == "true" || value == "yes" || value == "on" || value == "y";
}

std::int64_t YamlReader::integer(const YAML::Node& node, const std::string& path, std::int64_t lo,
                                 std::int64_t hi) {
  visit(path);
  std::int64_t value = 0;
  if (!node.IsScalar() || node.Tag() != "?" || !parse_integer(node.Scalar(), value)) {
    fail(path, fmt::format("must be a whole number, not {}", shown(node)));
  }
  if (value < lo || value > hi) {
    fail(path, fmt::format("{} is out of range ({} to {})", node.Scalar(), lo, hi));
  }
  return value;
}

std::string YamlReader::join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string YamlReader::item(const std::string& path, std::size_t index) {
  return fmt::format("{}[{}]", path, index);
}

std::string YamlReader::shown(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar().substr(0, 200) + "'";
  return describe(node);
}

std::string YamlReader::describe(const YAML::Node& node) {
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "nothing";
  return "'" + node.Scalar().substr(0, 200) + "'";
}

}  // namespace tessera::base
