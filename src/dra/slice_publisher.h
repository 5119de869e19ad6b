// Keeps the node's ResourceSlices current through the API server: the pool's slices are
// rewritten at a new generation whenever what they say changes (a GPU's health, the config's
// defaults for shared GPUs), and slices left over from an older layout are deleted. Consumers use
// only the slices of a pool's highest generation, so a pool is never seen half-written.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/status.h"
#include "dra/pool.h"
#include "kube/cluster.h"

namespace tessera::dra {

class SlicePublisher {
 public:
  SlicePublisher(const kube::Cluster& cluster, std::string driver, std::string node);

  // Publishes the pool if it differs from what was last published (or that failed). A failure
  // says which slice and why; the next call tries again.
  base::Status publish(const node::Inventory& inventory, const GpuHealth& health,
                       const SharedDefaults& defaults);
  std::int64_t generation() const { return generation_; }
  // The next publish looks at the API server's slices again, and rewrites the pool only if
  // they no longer say it (someone deleted or edited one).
  void recheck() { current_ = false; }

  // The name of the pool's `index`th slice.
  std::string slice_name(std::size_t index) const;

 private:
  const kube::Cluster& cluster_;
  std::string driver_, node_;
  std::vector<nlohmann::json> published_;  // at generation 0, to compare
  bool current_ = false;
  std::int64_t generation_ = 0;
};

}  // namespace tessera::dra
