// Kubernetes objects as the extender sees them, in the placement engine's terms: nodes with the
// capacity Tessera advertises, and pods with NVIDIA and HAMi GPU resources.
//
// Node capacity: CPU and memory from status.allocatable, GPUs from the annotation
//   tessera.io/gpus: {"model": "A100-SXM4-80GB", "count": 8, "memory_mib": 81920}
// (every GPU of a node is alike). A pod's placement is recorded on it as
//   tessera.io/assignment: {"node": "n1", "gpus": [0, 3], "milli": 500}
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kube/objects.h"
#include "sched/engine.h"

namespace tessera::extender {

using sched::Cluster;
using sched::kMilli;
using sched::kMostGpusPerNode;
using sched::NodeSpec;
using sched::PodSpec;
using sched::Request;

using kube::assignment_from_annotation;
using kube::kMostNameLength;
using kube::pod_from_json;
using kube::PodRequest;
using kube::RecordedAssignment;

static_assert(kube::kMostGpusPerNode == kMostGpusPerNode);

using contract::kAssignmentAnnotation;
using contract::kGpusAnnotation;

// A MIG GPU as its node agent lists it, complete enough to plan a re-cut from: the GPU index
// tessera.io/mig-layout names, the catalog model, and each GPU instance's profile (as NVML
// names it), placement and whether a pod holds it.
struct MigGpuLayout {
  struct Instance {
    std::string profile;
    int start = 0;
    bool held = true;
    bool operator==(const Instance&) const = default;
  };
  int index = 0;
  std::string model;
  std::vector<Instance> instances;
  bool operator==(const MigGpuLayout&) const = default;
};

struct NodeInfo {
  NodeSpec spec;
  std::int64_t gpu_memory_mib = 0;     // each GPU's memory
  std::vector<std::string> gpu_uuids;  // in the engine's numbering; empty if not given
  // GPUs the kubelet counts out replica by replica (time-sliced, MPS): whole-GPU pods may use
  // them, the kubelet's count deciding, and the engine holds nothing of them.
  int kubelet_counted_gpus = 0;
  // MIG GPUs whose entry says where each instance sits and whether it is held (newer agents).
  std::vector<MigGpuLayout> mig_gpus;
};

// Whether `pod` asks for GPUs the kubelet alone counts on this node: whole GPUs, on a node
// whose GPUs are all time-sliced or shared through MPS.
bool kubelet_counts(const NodeInfo& node, const PodRequest& pod);

// Throws std::runtime_error naming the node and the field at fault.
NodeInfo node_from_json(const nlohmann::json& node);

// The engine's request for `pod` on a node whose GPUs each have `gpu_memory_mib`: a GPU
// count with neither memory nor cores asks for whole GPUs.
Request request_on(const Cluster& cluster, const PodRequest& pod, std::int64_t gpu_memory_mib);

// Why a pod may not use a node's GPU model at all (empty if it may).
std::string model_refusal(const PodRequest& pod, const std::string& model);

}  // namespace tessera::extender
