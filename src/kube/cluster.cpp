#include "kube/cluster.h"

#include <fmt/core.h>

namespace tessera::kube {

std::string Collection::describe() const {
  const char* what = kind == Kind::nodes ? "nodes" : "pods";
  if (node.empty()) return what;
  return kind == Kind::nodes ? fmt::format("node {}", node) : fmt::format("pods on node {}", node);
}

}  // namespace tessera::kube
