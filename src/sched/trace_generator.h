// Traces of the same cluster with another shape: more or fewer GPU-sharing pods, multi-GPU pods,
// pods restricted to a GPU model, CPU per GPU pod, CPU-only pods. The FGD paper varied these
// to make its traces (gpushare40, multigpu30, gpuspec10, cpu050 from default); Tessera tunes its
// default policy on traces generated this way and keeps data/openb as the test.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/model.h"

namespace tessera::sched {

struct TraceShape {
  // Shares of the GPU the pods ask for (num_gpu × gpu_milli summed) taken by sharing pods and
  // by pods of several GPUs; whole one-GPU pods take the rest. Negative: as in the source.
  double sharing = -1;
  double multi_gpu = -1;
  // Share of GPU pods restricted to one GPU model, chosen among the models whose nodes could
  // hold the pod: weighed by their GPUs, or each alike (a rare model then meets as many
  // restricted pods as a common one). Negative: as in the source.
  double gpu_spec = -1;
  enum class ModelChoice { by_gpus, uniform };
  ModelChoice model_choice = ModelChoice::by_gpus;
  double gpu_pod_cpu = 1;  // factor on each GPU pod's CPU (within the largest node that fits)
  double cpu_only = 1;     // factor on the number of CPU-only pods
};

// Why `shape` cannot be generated from `source` (empty if it can): a share out of range, or a
// kind of pod asked for that the source has none of.
std::string why_not_generable(const std::vector<PodSpec>& source, const TraceShape& shape);

// Pods drawn from `source` with replacement (the same request sizes, CPU and memory) until each
// kind's share of the source's total GPU is met; the total GPU asked stays the source's. Named
// gen-pod-<n>, without times. Throws std::invalid_argument with why_not_generable's reason.
std::vector<PodSpec> generate_trace(const std::vector<PodSpec>& source,
                                    const std::vector<NodeSpec>& nodes, const TraceShape& shape,
                                    std::uint64_t seed);

}  // namespace tessera::sched
