// Prometheus' text exposition format (0.0.4), as the node agent and the extender serve it:
// families declared with their type and help, samples added to any of them in any order,
// written out family by family.
#pragma once

#include <string>
#include <vector>

namespace tessera::base {

class Exposition {
 public:
  // type: counter, gauge or histogram.
  void family(const char* name, const char* type, const char* help);
  // A sample of `name`, which is a declared family or (for a histogram) one of its series,
  // such as name_bucket; `labels` as written between the braces (escape values with
  // metric_label), or empty. A sample of an undeclared family is a programming error.
  void add(const std::string& name, const std::string& labels, double value);
  std::string text() const;

 private:
  struct Family {
    std::string name;
    const char* type;
    const char* help;
    std::string samples;
  };
  std::vector<Family> families_;
};

// A label value, escaped (backslash, double quote, newline) as the format asks; its first 256
// bytes, so that no outside text makes a series unbounded.
std::string metric_label(const std::string& text);

}  // namespace tessera::base
