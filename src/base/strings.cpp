#include "base/strings.h"

#include <algorithm>
#include <cctype>

namespace tessera::base {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  for (;;) {
    const std::size_t at = text.find(separator);
    parts.emplace_back(text.substr(0, at));
    if (at == std::string_view::npos) return parts;
    text.remove_prefix(at + 1);
  }
}

std::vector<std::string> split_list(std::string_view text, char separator) {
  std::vector<std::string> items;
  for (std::string& part : split(text, separator)) {
    const std::size_t first = part.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    items.push_back(part.substr(first, part.find_last_not_of(" \t") + 1 - first));
  }
  return items;
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string text;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) text += separator;
    text += parts[i];
  }
  return text;
}

}  // namespace tessera::base
