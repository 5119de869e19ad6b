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

#include "sched/engine.h"

namespace tessera::extender {

using sched::Cluster;
using sched::kMaxGpusPerNode;
using sched::kMilli;
using sched::NodeSpec;
using sched::PodSpec;
using sched::Request;

inline constexpr const char* kGpusAnnotation = "tessera.io/gpus";
inline constexpr const char* kAssignmentAnnotation = "tessera.io/assignment";
inline constexpr const char* kPolicyAnnotation = "tessera.io/policy";

inline constexpr std::size_t kMostNameLength = 253;  // a DNS subdomain, as Kubernetes allows

struct NodeInfo {
  NodeSpec spec;
  std::int64_t gpu_memory_mib = 0;  // each GPU's memory
};

// Throws std::runtime_error naming the node and the field at fault.
NodeInfo node_from_json(const nlohmann::json& node);

struct PodRequest {
  std::string uid, name, namespace_name;
  std::int64_t cpu_milli = 0, memory_mib = 0;
  int gpus = 0;                                     // nvidia.com/gpu
  std::int64_t gpumem_mib = 0;                      // nvidia.com/gpumem, per GPU
  int gpumem_percent = 0;                           // nvidia.com/gpumem-percentage
  int gpucores = 0;                                 // nvidia.com/gpucores, percent of a GPU
  std::vector<std::string> use_types, nouse_types;  // nvidia.com/use-gputype, nouse-gputype
  std::string policy;  // tessera.io/policy or HAMi's gpu-scheduler-policy
};

// Throws std::runtime_error naming the pod and the field at fault.
PodRequest pod_from_json(const nlohmann::json& pod);

// A pod's tessera.io/assignment annotation: the node and the GPU indices there.
struct RecordedAssignment {
  std::string node;
  std::vector<int> gpus;  // distinct, each below kMaxGpusPerNode
};
// Throws std::runtime_error saying what is wrong with it.
RecordedAssignment assignment_from_annotation(const nlohmann::json& text);

// The engine's request for `pod` on a node whose GPUs each have `gpu_memory_mib`: a GPU
// count with neither memory nor cores asks for whole GPUs.
Request request_on(const Cluster& cluster, const PodRequest& pod, std::int64_t gpu_memory_mib);

// Why a pod may not use a node's GPU model at all (empty if it may).
std::string model_refusal(const PodRequest& pod, const std::string& model);

}  // namespace tessera::extender
