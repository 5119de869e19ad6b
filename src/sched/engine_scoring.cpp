// The placement engine's measures (engine.h): FGD's fragmentation of a node against the target
// workload, and each policy's score of a node for a request.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "sched/engine.h"

namespace tessera::sched {
namespace {

// Normalisation constants of the FGD paper's simulator (its largest node specification).
constexpr double kLargestSpecCpu = 128000;
constexpr double kLargestSpecGpu = 8000;
constexpr double kTopScore = 100;

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

}  // namespace

// --- fragmentation -------------------------------------------------------------------------

void Cluster::set_target_workload(const std::vector<PodSpec>& pods, double coverage) {
  std::vector<Request> requests;
  requests.reserve(pods.size());
  for (const PodSpec& pod : pods) requests.push_back(request_for(pod));
  set_target_workload(requests, coverage);
}

void Cluster::set_target_workload(const std::vector<Request>& requests, double coverage) {
  struct Key {
    std::int64_t cpu;
    int gpus, milli;
    std::uint64_t models;
    std::array<std::pair<int, int>, kMostMigAsks> mig;
    bool operator<(const Key& other) const {
      return std::tie(cpu, gpus, milli, models, mig) <
             std::tie(other.cpu, other.gpus, other.milli, other.models, other.mig);
    }
  };
  std::map<Key, TaskClass> by_key;  // weighed by count until ranked
  double cpu = 0, gpu = 0;          // of the GPU pods
  for (const Request& request : requests) {
    // CPU-only pods are classes too, as the paper's experiments ran it (isInvolvedCpuPods):
    // an idle GPU is a fragment for a pod that wants none.
    Key key{request.cpu_milli, request.gpus, request.gpu_milli, request.models, {}};
    double mig_milli = 0;
    for (int k = 0; k < request.mig_asks; ++k) {
      const MigAsk& ask = request.mig[k];
      key.mig[static_cast<std::size_t>(k)] = {ask.profile, ask.count};
      if (ask.profile < mig_profile_milli_.size())
        mig_milli += static_cast<double>(ask.count) * mig_profile_milli_[ask.profile];
    }
    TaskClass& task = by_key[key];
    if (task.weight == 0) {
      task.request = request;
      task.request.memory_mib = 0;  // classes are measured by CPU and GPU, as in the paper
    }
    ++task.weight;
    if (request.asks_gpu()) {
      cpu += static_cast<double>(request.cpu_milli);
      gpu += static_cast<double>(request.gpus) * request.gpu_milli + mig_milli;
    }
  }
  std::vector<TaskClass> ranked;
  for (const auto& [key, task] : by_key) ranked.push_back(task);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const TaskClass& a, const TaskClass& b) { return a.weight > b.weight; });
  classes_.clear();
  double covered = 0;
  for (const TaskClass& task : ranked) {
    if (covered >= coverage * static_cast<double>(requests.size())) break;
    covered += task.weight;
    classes_.push_back(task);
  }
  for (TaskClass& task : classes_) task.weight /= covered;
  cpu_per_gpu_milli_ = gpu > 0 ? cpu / gpu : 0;
  measure_model_reservations(requests);
  fragmentation_memo_ = FragmentationMemo();
  score_cache_.clear();  // cached scores were measured against the old workload
}

// Each model's share of the GPU that the workload's model-restricted pods ask for, over its
// share of the cluster's GPUs, at most 1. A pod restricted to several models is spread evenly
// over those the cluster has.
void Cluster::measure_model_reservations(const std::vector<Request>& requests) {
  const std::size_t models = models_.size();
  std::vector<double> restricted(models, 0), capacity(models, 0);
  double asked = 0, cluster_capacity = 0;
  for (const Request& request : requests) {
    const double milli = static_cast<double>(request.gpus) * request.gpu_milli;
    asked += milli;
    const int allowed = std::popcount(request.models & existing_models());
    if (milli == 0 || allowed == 0) continue;
    for (std::size_t m = 0; m < models; ++m) {
      if ((request.models >> m) & 1u) restricted[m] += milli / allowed;
    }
  }
  for (const Node& node : nodes_) {
    if (node.model < 0) continue;
    capacity[static_cast<std::size_t>(node.model)] += static_cast<double>(node.gpus) * kMilli;
    cluster_capacity += static_cast<double>(node.gpus) * kMilli;
  }
  model_reserved_.assign(models, 0);
  for (std::size_t m = 0; m < models; ++m) {
    if (asked > 0 && capacity[m] > 0) {
      model_reserved_[m] = std::min(1.0, restricted[m] / asked / (capacity[m] / cluster_capacity));
    }
  }
}

double Cluster::reservation_cost(const Node& node, const Request& request) const {
  if (node.model < 0 || request.gpus == 0) return 0;
  const std::uint64_t own = std::uint64_t{1} << node.model;
  const bool may_go_elsewhere =
      request.models == 0 || (request.models & existing_models() & ~own) != 0;
  if (!may_go_elsewhere) return 0;
  return model_reserved_[static_cast<std::size_t>(node.model)] * static_cast<double>(request.gpus) *
         request.gpu_milli;
}

double Cluster::fragmentation(const Node& node, ForeignModels foreign) const {
  const std::int64_t left = node.gpu_milli_left();
  if (left == 0) return 0;
  // Memoised by what it depends on: model, CPU left and the GPUs' free milli (and whether
  // each may be shared) as a multiset.
  std::int32_t sorted[kMostGpusPerNode];
  for (int i = 0; i < node.gpus; ++i)
    sorted[i] = node.gpu_left[i] * 2 + ((node.whole_only >> i) & 1);
  std::sort(sorted, sorted + node.gpus);
  std::uint64_t key = 0xcbf29ce484222325ull;
  auto mix = [&key](std::uint64_t value) { key = (key ^ value) * 0x100000001b3ull; };
  mix(static_cast<std::uint64_t>(node.model + 1) * 2 + (foreign == ForeignModels::ignored));
  mix(static_cast<std::uint64_t>(node.cpu_left));
  for (int i = 0; i < node.gpus; ++i) mix(static_cast<std::uint64_t>(sorted[i]) + 7);
  for (int k = 0; k < node.mig_slots; ++k) {
    const MigSlot& slot = node.mig[k];
    mix((std::uint64_t{slot.profile} << 48) | (std::uint64_t{std::uint16_t(slot.free)} << 32) |
        (std::uint64_t{std::uint16_t(slot.milli)} << 16) | 0x9e37u);
  }
  {
    base::MutexLock locked(fragmentation_memo_.mutex);
    if (const auto found = fragmentation_memo_.values.find(key);
        found != fragmentation_memo_.values.end()) {
      return found->second;
    }
  }
  double amount = 0;
  for (const TaskClass& task : classes_) {
    if (foreign == ForeignModels::ignored && task.request.gpus > 0 &&
        !node.allows(task.request.models)) {
      continue;
    }
    amount += task.weight * static_cast<double>(left - usable_by(node, task.request));
  }
  base::MutexLock locked(fragmentation_memo_.mutex);
  constexpr std::size_t kMostMemoised = 1 << 20;  // a long-lived scheduler meets ever new nodes
  if (fragmentation_memo_.values.size() >= kMostMemoised) fragmentation_memo_.values.clear();
  fragmentation_memo_.values.emplace(key, amount);
  return amount;
}

// What of the node's free GPU milli a pod of `request` could use: nothing unless it fits (by
// CPU), else the GPUs large enough for its share and the free MIG devices of its profiles.
// Everything else free is a fragment for it, MIG devices included for a GPU-sharing pod and
// shared GPUs for a MIG pod: the two kinds are counted in the same milli-GPU.
std::int64_t Cluster::usable_by(const Node& node, const Request& request) {
  if (node.cpu_left < request.cpu_milli || !request.asks_gpu()) return 0;
  if (!mig_fits(node, request)) return 0;
  std::int64_t usable = 0;
  for (int k = 0; k < request.mig_asks; ++k) {
    const MigSlot* slot = node.mig_slot(request.mig[k].profile);
    usable += std::int64_t{slot->free} * slot->milli;
  }
  if (request.gpus == 0) return usable;
  if (!node.allows(request.models)) return 0;
  int fitting = 0;
  for (int i = 0; i < node.gpus; ++i) {
    if (node.takes(i, request.gpu_milli)) {
      ++fitting;
      usable += node.gpu_left[i];
    }
  }
  return fitting >= request.gpus ? usable : 0;
}

double Cluster::fragmentation() const {
  double total = 0;
  for (const Node& node : nodes_) total += fragmentation(node);
  return total;
}

// A node that runs out of CPU strands its free GPUs: FGD sees that only once the CPU left is
// below some class's request, one pod at a time, and by then the GPUs are lost. Counting the
// free GPU beyond what the CPU left can feed at the workload's mean ratio steers CPU-heavy pods
// (and CPU-only ones) to nodes with CPU to spare, and CPU-light pods to nodes short of it.
double Cluster::stranded_gpu(const Node& node) const {
  if (cpu_per_gpu_milli_ <= 0) return 0;
  const double fed = static_cast<double>(node.cpu_left) / cpu_per_gpu_milli_;
  return std::max(0.0, static_cast<double>(node.gpu_milli_left()) - fed);
}

// How much a stranded milli-GPU, and a reserved one taken (reservation_cost), weigh against a
// fragmented one in fgd_balanced: as much.
// Chosen on generated traces (docs/scheduler.md), not on data/openb: 1 was the only weight of
// 1, 2 and 4 that lost to FGD on none of them; 4 lost where CPU-only pods are many.
constexpr double kStrandedWeight = 1;

// --- scoring -----------------------------------------------------------------------------

Cluster::Score Cluster::fgd_score(const Node& node, const Request& request, Policy policy) const {
  const bool balanced = policy == Policy::fgd_balanced;
  auto fragmented = [&](const Node& state) {
    if (!balanced) return fragmentation(state, ForeignModels::fragmented);
    return fragmentation(state, ForeignModels::ignored) + kStrandedWeight * stranded_gpu(state);
  };
  // Taking GPUs that model-restricted pods will need counts as fragmenting them.
  const double before = fragmented(node) - (balanced ? reservation_cost(node, request) : 0);
  auto rate = [&](double after) {
    const double gradient = before - after;  // fragmentation removed (negative: added)
    return std::floor(sigmoid(gradient / 1000) * kTopScore);
  };
  Score best;
  best.primary = -1e300;
  Node changed = node;
  changed.cpu_left -= request.cpu_milli;
  take_mig(changed, request, -1);
  if (request.shares_gpu()) {
    for (int i = 0; i < node.gpus; ++i) {
      if (!node.takes(i, request.gpu_milli)) continue;
      changed.gpu_left[i] = static_cast<std::int16_t>(node.gpu_left[i] - request.gpu_milli);
      const double value = rate(fragmented(changed));
      changed.gpu_left[i] = node.gpu_left[i];
      if (best.gpu < 0 || value > best.primary) {
        best.primary = value;
        best.gpu = i;
      }
    }
    return best;
  }
  for (int i = 0, taken = 0; i < node.gpus && taken < request.gpus; ++i) {
    if (node.gpu_left[i] == kMilli) {
      changed.gpu_left[i] = 0;
      ++taken;
    }
  }
  best.primary = rate(fragmented(changed));
  return best;
}

Cluster::Score Cluster::score(const Node& node, const Request& request, Policy policy) const {
  Score result;
  const double gpu_request = static_cast<double>(request.gpus) * request.gpu_milli +
                             static_cast<double>(mig_milli_asked(node, request));
  switch (policy) {
    case Policy::random:
      return result;
    case Policy::best_fit:
    case Policy::spread: {
      const double leftover =
          (static_cast<double>(node.cpu_left - request.cpu_milli) / kLargestSpecCpu +
           (static_cast<double>(node.gpu_milli_left()) - gpu_request) / kLargestSpecGpu) *
          0.5;
      result.primary =
          policy == Policy::best_fit ? std::floor((1 - leftover) * kTopScore) : leftover;
      return result;
    }
    case Policy::dot_product: {
      // As the paper ran it: CPU and all GPUs merged into two dimensions, each normalised by
      // the largest node's capacity; a smaller product scores higher.
      const double dot = (static_cast<double>(node.cpu_left) / kLargestSpecCpu *
                              (static_cast<double>(request.cpu_milli) / kLargestSpecCpu) +
                          static_cast<double>(node.gpu_milli_left()) / kLargestSpecGpu *
                              (gpu_request / kLargestSpecGpu)) /
                         2;
      result.primary = std::floor((1 - dot) * kTopScore);
      return result;
    }
    case Policy::gpu_packing: {
      if (request.gpus == 0) {  // MIG devices where their profile is most in use already
        result.primary = request.mig_asks > 0 ? mig_packing(node, request) * kTopScore : 0;
        return result;
      }
      const int free_gpus = node.fully_free_gpus();
      if (free_gpus == node.gpus) {  // an idle node: last resort
        result.primary = std::max(std::floor(kTopScore / 3) - free_gpus, double(free_gpus));
        return result;
      }
      int order[kMostGpusPerNode];
      for (int i = 0; i < node.gpus; ++i) order[i] = i;
      std::stable_sort(order, order + node.gpus,
                       [&](int a, int b) { return node.gpu_left[a] < node.gpu_left[b]; });
      int needed = request.gpus, fresh = 0;
      std::int64_t free_ratio = 0;
      for (int k = 0; k < node.gpus && needed > 0; ++k) {
        const int i = order[k];
        if (!node.takes(i, request.gpu_milli)) continue;
        --needed;
        fresh += node.gpu_left[i] == kMilli;
        free_ratio += node.gpu_left[i] * 100 / kMilli;
        if (result.gpu < 0) result.gpu = i;
      }
      if (fresh > 0) {  // a free GPU on a used node
        result.primary = std::max(std::floor(kTopScore / 2) - fresh, std::floor(kTopScore / 3));
      } else {  // partly used GPUs
        result.primary = std::max(kTopScore - static_cast<double>(free_ratio / 10), kTopScore / 2);
      }
      return result;
    }
    case Policy::gpu_clustering: {
      if (!request.asks_gpu()) return result;
      int kinds = 0;
      for (int kind = 1; kind < 8; ++kind) kinds += node.running_by_kind[kind] > 0;
      const double base = std::floor(
          25.0 * (kLargestSpecGpu - static_cast<double>(node.gpu_milli_left())) / kLargestSpecGpu);
      if (node.running_by_kind[request.kind] > 0) {
        result.primary = base + (kinds == 1 ? 75 : 50);
      } else {
        result.primary = base + (kinds == 0 ? 25 : 0);
      }
      return result;
    }
    case Policy::fgd:
    case Policy::fgd_packed:
    case Policy::fgd_balanced:
      return fgd_score(node, request, policy);
  }
  return result;
}

// Tessera's tie-breaker among nodes FGD rates equal (its score is an integer from 0 to 100,
// so many are): a CPU-only pod goes where the least GPU is left, since CPU there is worth
// least to GPU pods; a GPU-sharing pod goes where a GPU is already partly used, next to other
// sharing pods, keeping whole GPUs whole. Higher is preferred.
double Cluster::packing_preference(const Node& node, const Request& request) {
  if (request.mig_asks > 0) return mig_packing(node, request);
  if (request.gpus == 0) return -static_cast<double>(node.gpu_milli_left());
  if (!request.shares_gpu()) return 0;
  for (int i = 0; i < node.gpus; ++i) {
    if (node.gpu_left[i] > 0 && node.gpu_left[i] < kMilli) return 1;
  }
  return 0;
}

// A node where the pod's profiles are already most in use: nodes with every device free stay
// so for pods that ask for several.
double Cluster::mig_packing(const Node& node, const Request& request) {
  double packed = 0;
  for (int k = 0; k < request.mig_asks; ++k) {
    const MigSlot* slot = node.mig_slot(request.mig[k].profile);
    if (slot != nullptr && slot->total > 0) {
      packed += static_cast<double>(slot->total - slot->free + request.mig[k].count) / slot->total;
    }
  }
  return request.mig_asks > 0 ? packed / request.mig_asks : 0;
}

std::int64_t Cluster::mig_milli_asked(const Node& node, const Request& request) {
  std::int64_t milli = 0;
  for (int k = 0; k < request.mig_asks; ++k) {
    if (const MigSlot* slot = node.mig_slot(request.mig[k].profile); slot != nullptr)
      milli += std::int64_t{request.mig[k].count} * slot->milli;
  }
  return milli;
}

void Cluster::take_mig(Node& node, const Request& request, int sign) {
  for (int k = 0; k < request.mig_asks; ++k) {
    if (MigSlot* slot = node.mig_slot(request.mig[k].profile); slot != nullptr)
      slot->free = static_cast<std::int16_t>(slot->free + sign * request.mig[k].count);
  }
}

std::uint8_t Cluster::mig_profile_id(const std::string& profile) const {
  const auto found = std::find(mig_profiles_.begin(), mig_profiles_.end(), profile);
  return found == mig_profiles_.end() ? kUnknownMigProfile
                                      : static_cast<std::uint8_t>(found - mig_profiles_.begin());
}

int Cluster::mig_free(int node, const std::string& profile) const {
  const MigSlot* slot = nodes_[node].mig_slot(mig_profile_id(profile));
  return slot == nullptr ? 0 : slot->free;
}

}  // namespace tessera::sched
