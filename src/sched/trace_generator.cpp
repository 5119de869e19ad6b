#include "sched/trace_generator.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessera::sched {
namespace {

enum Kind { kCpuOnly, kSharing, kWholeOne, kMultiGpu, kKinds };

Kind kind_of(const PodSpec& pod) {
  if (pod.gpus == 0) return kCpuOnly;
  if (pod.shares_gpu()) return kSharing;
  return pod.gpus == 1 ? kWholeOne : kMultiGpu;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case kCpuOnly:
      return "CPU-only";
    case kSharing:
      return "GPU-sharing";
    case kWholeOne:
      return "whole one-GPU";
    case kMultiGpu:
      return "multi-GPU";
    case kKinds:
      break;
  }
  return "?";
}

bool out_of_range(double share) {
  return !(share <= 1);  // NaN too
}

// The source's share of GPU asked by each kind (the whole trace's GPU: index kKinds).
std::vector<std::int64_t> gpu_by_kind(const std::vector<PodSpec>& pods) {
  std::vector<std::int64_t> sums(kKinds + 1, 0);
  for (const PodSpec& pod : pods) {
    sums[kind_of(pod)] += pod.gpu_milli_total();
    sums[kKinds] += pod.gpu_milli_total();
  }
  return sums;
}

// GPU models a pod could run on (its GPU count, CPU and memory fit some node of the model),
// each weighed by the model's GPUs in the cluster.
std::map<std::string, int> models_for(const PodSpec& pod, const std::vector<NodeSpec>& nodes) {
  std::map<std::string, int> weights;
  for (const NodeSpec& node : nodes) {
    if (node.gpus >= pod.gpus && node.cpu_milli >= pod.cpu_milli &&
        node.memory_mib >= pod.memory_mib) {
      weights[node.model] += node.gpus;
    }
  }
  return weights;
}

}  // namespace

std::string why_not_generable(const std::vector<PodSpec>& source, const TraceShape& shape) {
  for (const auto& [name, share] :
       {std::pair{"sharing", shape.sharing}, std::pair{"multi-gpu", shape.multi_gpu},
        std::pair{"gpu-spec", shape.gpu_spec}}) {
    if (out_of_range(share)) {
      return fmt::format("{} share {} must be at most 1 (negative: as in the source)", name, share);
    }
  }
  const std::vector<std::int64_t> sums = gpu_by_kind(source);
  if (sums[kKinds] == 0) return "the source trace has no GPU pods";
  const double sharing =
      shape.sharing >= 0 ? shape.sharing : static_cast<double>(sums[kSharing]) / sums[kKinds];
  const double multi =
      shape.multi_gpu >= 0 ? shape.multi_gpu : static_cast<double>(sums[kMultiGpu]) / sums[kKinds];
  if (sharing + multi > 1 + 1e-9) {
    return fmt::format("sharing ({:.3f}) and multi-GPU ({:.3f}) pods ask for more than all the GPU",
                       sharing, multi);
  }
  const double shares[kKinds] = {0, sharing, 1 - sharing - multi, multi};
  for (int kind = kSharing; kind < kKinds; ++kind) {
    if (shares[kind] > 1e-9 && sums[kind] == 0) {
      return fmt::format("the source trace has no {} pods to draw from",
                         kind_name(static_cast<Kind>(kind)));
    }
  }
  if (!(shape.gpu_pod_cpu > 0 && shape.gpu_pod_cpu <= 100)) {
    return fmt::format("gpu-pod-cpu factor {} must be above 0 and at most 100", shape.gpu_pod_cpu);
  }
  if (!(shape.cpu_only >= 0 && shape.cpu_only <= 100)) {
    return fmt::format("cpu-only factor {} must be from 0 to 100", shape.cpu_only);
  }
  return {};
}

std::vector<PodSpec> generate_trace(const std::vector<PodSpec>& source,
                                    const std::vector<NodeSpec>& nodes, const TraceShape& shape,
                                    std::uint64_t seed) {
  if (const std::string why = why_not_generable(source, shape); !why.empty()) {
    throw std::invalid_argument(why);
  }
  std::vector<std::vector<const PodSpec*>> by_kind(kKinds);
  for (const PodSpec& pod : source) by_kind[kind_of(pod)].push_back(&pod);
  const std::vector<std::int64_t> sums = gpu_by_kind(source);
  const double total = static_cast<double>(sums[kKinds]);
  const double sharing = shape.sharing >= 0 ? shape.sharing * total : double(sums[kSharing]);
  const double multi = shape.multi_gpu >= 0 ? shape.multi_gpu * total : double(sums[kMultiGpu]);
  const double targets[kKinds] = {0, sharing, total - sharing - multi, multi};

  std::mt19937_64 random(seed);
  std::vector<PodSpec> pods;
  // GPU pods: drawn until the kind's GPU reaches its target (the last draw may pass it by less
  // than one pod).
  for (int kind = kSharing; kind < kKinds; ++kind) {
    const auto& pool = by_kind[kind];
    if (pool.empty()) continue;
    std::uniform_int_distribution<std::size_t> pick(0, pool.size() - 1);
    for (double asked = 0; asked < targets[kind];) {
      const PodSpec& pod = *pool[pick(random)];
      pods.push_back(pod);
      asked += static_cast<double>(pod.gpu_milli_total());
    }
  }
  // CPU-only pods: a factor on their number, drawn without replacement up to the source's.
  {
    std::vector<const PodSpec*> pool = by_kind[kCpuOnly];
    const auto wanted = static_cast<std::size_t>(std::llround(shape.cpu_only * pool.size()));
    std::shuffle(pool.begin(), pool.end(), random);
    for (std::size_t i = 0; i < wanted && !pool.empty(); ++i)
      pods.push_back(*pool[i % pool.size()]);
  }
  // The largest CPU of a node that could hold each GPU count: a scaled pod still fits somewhere.
  std::int64_t most_cpu[kMostGpusPerNode + 1] = {};
  for (const NodeSpec& node : nodes) {
    for (int gpus = 0; gpus <= std::min(node.gpus, kMostGpusPerNode); ++gpus)
      most_cpu[gpus] = std::max(most_cpu[gpus], node.cpu_milli);
  }
  std::bernoulli_distribution restricted(std::max(0.0, shape.gpu_spec));
  for (PodSpec& pod : pods) {
    if (pod.gpus == 0) continue;
    if (shape.gpu_pod_cpu != 1) {
      const double scaled = static_cast<double>(pod.cpu_milli) * shape.gpu_pod_cpu;
      const std::int64_t rounded = std::llround(scaled / 100) * 100;  // traces ask in 0.1 cores
      pod.cpu_milli = std::max<std::int64_t>(100, std::min(rounded, most_cpu[pod.gpus]));
    }
    if (shape.gpu_spec >= 0) {
      pod.models.clear();
      if (!restricted(random)) continue;
      std::map<std::string, int> weights = models_for(pod, nodes);
      if (shape.model_choice == TraceShape::ModelChoice::uniform) {
        for (auto& [model, weight] : weights) weight = 1;
      }
      int sum = 0;
      for (const auto& [model, gpus] : weights) sum += gpus;
      if (sum == 0) continue;  // fits no node; it stays pending whatever it asks
      int chosen = std::uniform_int_distribution<int>(0, sum - 1)(random);
      for (const auto& [model, gpus] : weights) {
        if (chosen < gpus) {
          pod.models = {model};
          break;
        }
        chosen -= gpus;
      }
    }
  }
  std::shuffle(pods.begin(), pods.end(), random);
  for (std::size_t i = 0; i < pods.size(); ++i) {
    pods[i].name = fmt::format("gen-pod-{:05}", i);
    pods[i].creation_time = pods[i].deletion_time = -1;
  }
  return pods;
}

}  // namespace tessera::sched
