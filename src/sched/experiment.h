// Trace replay through the placement engine (the same engine the extender uses).
//
// The FGD paper's experiment: pods arrive until their GPU requests reach `max_load` of the
// cluster's GPU capacity; they are placed one at a time; nothing leaves; a pod that fits
// nowhere stays pending. The curve is the GPU allocation ratio (allocated / capacity) against
// arrived load (requested / capacity).
//
// Which pods arrive: the whole trace in a seeded random order and then pods sampled from it
// with replacement, as the paper's scripts do (shuffle, then inflate); or, with
// Workload::sample, only pods sampled with replacement.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sched/dynamic_mig.h"
#include "sched/engine.h"
#include "sched/trace.h"

namespace tessera::sched {

enum class Workload { trace_then_sample, sample };

struct CurvePoint {
  double arrived = 0;     // requested GPU / capacity
  double allocated = 0;   // allocated GPU / capacity
  double fragmented = 0;  // fragmented GPU (under the target workload) / capacity
};

struct RunResult {
  Policy policy = Policy::fgd;
  std::string name;  // the policy's, or the reference's
  std::uint64_t seed = 0;
  std::vector<CurvePoint> curve;  // at every 1 % of arrived load
  long placed = 0, pending = 0;
  long preemptions = 0, victims = 0;  // with preemption: pods placed by evicting, pods evicted
  // With MIG-capable GPUs: GPUs re-cut, MIG modes changed, and the GPU-seconds they cost.
  long mig_recuts = 0, mig_mode_changes = 0;
  double mig_unavailable_gpu_seconds = 0;
  double seconds = 0;
  // Allocation ratio when arrived load first reached `load`.
  double allocated_at(double load) const;
};

// Why `nodes` cannot be the cluster of an experiment (empty if it can): it has no GPU, or
// more GPU models than the engine holds.
std::string why_not_a_cluster(const std::vector<NodeSpec>& nodes);
// Why `trace` cannot be sampled up to `max_load` of the cluster's GPUs in bounded time (no
// pod asks for a GPU, or so little that it would take more arrivals than are simulated).
std::string why_not_inflatable(const std::vector<NodeSpec>& nodes,
                               const std::vector<PodSpec>& trace, double max_load);
// Why `trace` cannot be replayed in time (a pod without a creation time).
std::string why_not_replayable(const std::vector<PodSpec>& trace);

// Both run functions throw std::invalid_argument with the reason above for inputs they
// cannot run.
// With `preemption`, a pod that fits nowhere evicts pods of lower priority (priority_of_qos):
// on the node where that takes the fewest (then the lowest priorities; Cluster::
// preemption_victims), as the extender's preempt verb chooses them. Evicted pods are not
// placed again.
// With `mig`, the nodes' MIG-capable GPUs (NodeSpec::mig_capable_gpus) are cut as it says, and
// with mig->dynamic a pod that fits nowhere may get room by a change of cut (dynamic_mig.h);
// not with preemption (refused).
RunResult run_inflation(const std::vector<NodeSpec>& nodes, const std::vector<PodSpec>& trace,
                        Policy policy, std::uint64_t seed, double max_load,
                        Workload workload = Workload::trace_then_sample, bool preemption = false,
                        const DynamicMigOptions* mig = nullptr);

// Offline references on the pods a run of `seed` meets (the same pods, in the same order, that
// every policy but `random` meets): not policies a scheduler could run, since they see every
// pod at once, but how far the online ones are from what is possible. The result holds the
// allocation at 100 % and at `max_load` arrived.
// - offline-packer: every arrived pod known in advance. Pods of several GPUs best-fit; one-GPU
//   pods node by node, each GPU its share of the node's CPU and memory; each GPU's room filled
//   by a subset sum of sharing pods within those shares; the rest best-fit. A pod that fits
//   nowhere is left out, as an offline packer may.
// - bound: no schedule of these pods on these nodes allocates more. The GPUs' capacity, the
//   GPU the pods ask for, and the GPU that the nodes' CPU can carry at all: pods taken in
//   order of GPU per CPU, the last one in part, until the CPU of the GPU nodes is spent.
enum class Reference { offline_packer, bound };
std::string reference_name(Reference reference);
RunResult run_reference(const std::vector<NodeSpec>& nodes, const std::vector<PodSpec>& trace,
                        Reference reference, std::uint64_t seed, double max_load,
                        Workload workload = Workload::trace_then_sample);

// Replays the trace in creation order with its deletions; the curve is sampled against the
// GPU requests of the pods alive at each point.
RunResult run_replay(const std::vector<NodeSpec>& nodes, const std::vector<PodSpec>& trace,
                     Policy policy, std::uint64_t seed);

struct Job {
  Policy policy;
  std::uint64_t seed;
  std::optional<Reference> reference{};  // set: this reference instead of the policy
};
// Runs jobs on `threads` threads; `progress` is called (serialised) as each finishes. If a
// job throws, the rest are not started and the first exception is rethrown here.
std::vector<RunResult> run_all(const std::vector<Job>& jobs, int threads,
                               const std::function<RunResult(const Job&)>& run,
                               const std::function<void(const RunResult&, int done)>& progress);

// A plot of mean allocation against arrived load per policy.
std::string plot_svg(const std::vector<RunResult>& results);

}  // namespace tessera::sched
