// Config documents as Tessera reads them (the node agent's plugin configs, mig-parted
// layouts): YAML loaded only within bounds, then walked strictly, every refusal naming the
// file, the field's path and the value.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace tessera::base {

// A document refused: "<origin>: <path>: <why>".
struct DocumentError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `text` as YAML, refused first where it is longer than `most_bytes` or nests flow
// collections deeper than `most_nesting` (yaml-cpp's parser recurses). Throws DocumentError.
YAML::Node load_yaml(std::string_view text, const std::string& origin, std::size_t most_bytes,
                     int most_nesting);

// The file at `path`, refused (DocumentError) past `most` bytes or where it cannot be read.
std::string read_file_bounded(const std::string& path, std::size_t most);

// Walks one document, keeping the path of what it reads for messages, with Go's YAML rules
// (a plain 12 or true is a number or a boolean, not a string), as NVIDIA's tools read them.
class YamlReader {
 public:
  // Counts every node looked at: aliases may make a small file a large tree.
  static constexpr int kMostNodesVisited = 100000;

  explicit YamlReader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& why) const;
  void visit(const std::string& path);

  // Absent or null: Go leaves the zero value then.
  bool is_absent(const YAML::Node& node) const { return !node.IsDefined() || node.IsNull(); }
  void expect_map(const YAML::Node& node, const std::string& path);
  // Refuses keys outside `known` and keys given twice.
  void check_keys(const YAML::Node& node, const std::string& path,
                  std::initializer_list<const char*> known);
  std::string text(const YAML::Node& node, const std::string& path);
  bool boolean(const YAML::Node& node, const std::string& path);
  std::int64_t integer(const YAML::Node& node, const std::string& path, std::int64_t lo,
                       std::int64_t hi);

  // A string that must be one of `choices`; refused with `refusal` and the value otherwise.
  template <typename T>
  T choice(const YAML::Node& node, const std::string& path,
           std::initializer_list<std::pair<const char*, T>> choices, const char* refusal) {
    const std::string value = text(node, path);
    for (const auto& [name, meaning] : choices) {
      if (value == name) return meaning;
    }
    std::string names;
    for (const auto& [name, meaning] : choices)
      names += (names.empty() ? "" : ", ") + std::string(name);
    fail(path, refusal + value.substr(0, 200) + " (one of: " + names + ")");
  }

  static std::string join(const std::string& path, const std::string& key);
  static std::string item(const std::string& path, std::size_t index);
  // A value as a message shows it: a scalar quoted (its first 200 bytes), else its kind.
  static std::string shown(const YAML::Node& node);

 private:
  static std::string describe(const YAML::Node& node);

  std::string origin_;
  int visited_ = 0;
};

}  // namespace tessera::base
