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

}  // namespace tessera
