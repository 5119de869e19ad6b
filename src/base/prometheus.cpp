#include "base/prometheus.h"

#include <fmt/core.h>

#include <string_view>

#include "common/check.h"

namespace tessera::base {

void Exposition::family(const char* name, const char* type, const char* help) {
  families_.push_back({name, type, help, {}});
}

void Exposition::add(const std::string& name, const std::string& labels, double value) {
  Family* owner = nullptr;
  for (Family& family : families_) {
    if (name == family.name) owner = &family;
    // A histogram's series: name_bucket, name_sum, name_count.
    if (std::string_view(family.type) == "histogram" && name.size() > family.name.size() &&
        name.compare(0, family.name.size(), family.name) == 0) {
      const std::string_view suffix = std::string_view(name).substr(family.name.size());
      if (suffix == "_bucket" || suffix == "_sum" || suffix == "_count") owner = &family;
    }
  }
  TESSERA_DCHECK(owner != nullptr);  // every sample's family is declared
  if (owner == nullptr) return;
  owner->samples += labels.empty() ? fmt::format("{} {}\n", name, value)
                                   : fmt::format("{}{{{}}} {}\n", name, labels, value);
}

std::string Exposition::text() const {
  std::string out;
  for (const Family& family : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", family.name, family.help, family.name,
                       family.type, family.samples);
  }
  return out;
}

std::string metric_label(const std::string& text) {
  std::string escaped;
  for (const char c : text.substr(0, 256)) {
    if (c == '\\' || c == '"') {
      escaped += '\\';
      escaped += c;
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

}  // namespace tessera::base
