// What the node agent tells the cluster about its GPUs: labels as gpu-feature-discovery
// writes them (docs/kubernetes.md), plus the GPU-sharing guide's nvidia.com/gpu.sharing, and the
// tessera.io/gpus annotation the scheduler places fractional pods by.
#pragma once

#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "node/config.h"
#include "node/health.h"
#include "node/mig_layout.h"
#include "node/nvml.h"
#include "node/resources.h"

namespace tessera::node {

using Labels = std::map<std::string, std::string>;

// GFD's labels for this node; `now` for nvidia.com/gfd.timestamp (unless noTimestamp).
Labels gpu_labels(const Inventory& inventory, const PluginConfig& config, std::time_t now);

// A label value as Kubernetes takes it: at most 63 of [A-Za-z0-9-_.], starting and ending
// with a letter or digit.
std::string label_value(const std::string& text);
// GFD's product name: the model with anything but [A-Za-z0-9-_. ] removed, spaces as '-'.
std::string product_name(const std::string& model);
// GFD's family for a compute capability: volta, turing, ampere, hopper, ...
std::string gpu_family(int major, int minor);

// Writes the labels as node-feature-discovery's local source reads them (key=value lines),
// replacing the file at once (a reader never sees half of it). Throws std::runtime_error.
void write_features_file(const std::string& directory, const Labels& labels);
inline constexpr const char* kFeaturesFileName = "tessera-gpu";

// The tessera.io/gpus annotation (contract::kGpusAnnotation): every GPU the node serves, with
// its UUID, model, memory, sharing mode, slices and health, in the inventory's order;
// contract/gpu_numbering.h says which the scheduler numbers. A MIG GPU's devices carry their
// GPU instance's placement (`start`), and with `held` (the instances pods hold) whether a pod
// holds it: what the scheduler plans a re-cut from (docs/mig.md).
nlohmann::json gpus_annotation(const Inventory& inventory, const ResourceMap& map,
                               const HealthBoard& health, SharingStrategy strategy,
                               const HeldInstances* held = nullptr);

}  // namespace tessera::node
