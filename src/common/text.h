// string_view helpers that never throw (std::string_view::substr does, which would pull
// the C++ runtime into the guest libraries).
#pragma once

#include <string_view>

namespace tessera {

inline std::string_view slice(std::string_view text, std::size_t position,
                              std::size_t count = std::string_view::npos) {
  if (position > text.size()) position = text.size();
  const std::size_t available = text.size() - position;
  return std::string_view(text.data() + position, count < available ? count : available);
}

// Whether `text` nests YAML or JSON flow collections ([ and {, outside quotes) deeper than
// `limit`: parsers that recurse (yaml-cpp) must be refused such input before they see it.
inline bool nests_deeper_than(std::string_view text, int limit) {
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

}  // namespace tessera
