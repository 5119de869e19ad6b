#include "sched/engine.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "common/check.h"

namespace tessera::sched {
namespace {

const std::vector<std::pair<Policy, const char*>>& policy_names() {
  static const std::vector<std::pair<Policy, const char*>> names = {
      {Policy::random, "random"},
      {Policy::best_fit, "best-fit"},
      {Policy::dot_product, "dot-product"},
      {Policy::gpu_packing, "gpu-packing"},
      {Policy::gpu_clustering, "gpu-clustering"},
      {Policy::spread, "spread"},
      {Policy::fgd, "fgd"},
      {Policy::fgd_packed, "fgd-packed"},
      {Policy::fgd_balanced, "fgd-balanced"}};
  return names;
}

int kind_of(int gpus, int milli, bool mig) {
  if (gpus == 0) return mig ? 6 : 0;
  if (gpus == 1 && milli < kMilli) return 1;
  if (gpus == 1) return 2;
  if (gpus == 2) return 3;
  if (gpus <= 4) return 4;
  return 5;
}

// Tessera's FGD policies break FGD's ties by packing_preference; FGD as published does not.
bool breaks_ties_by_packing(Policy policy) {
  return policy == Policy::fgd_packed || policy == Policy::fgd_balanced;
}

}  // namespace

Policy parse_policy(const std::string& name) {
  for (const auto& [policy, text] : policy_names()) {
    if (name == text) return policy;
  }
  std::string known;
  for (const auto& [policy, text] : policy_names())
    known += (known.empty() ? "" : ", ") + std::string(text);
  throw std::invalid_argument(fmt::format("unknown policy '{}' (known: {})", name, known));
}

std::string policy_name(Policy policy) {
  for (const auto& [candidate, text] : policy_names()) {
    if (candidate == policy) return text;
  }
  return "?";
}

const std::vector<Policy>& all_policies() {
  static const std::vector<Policy> policies = [] {
    std::vector<Policy> list;
    for (const auto& [policy, text] : policy_names()) list.push_back(policy);
    return list;
  }();
  return policies;
}

std::int64_t Node::gpu_milli_left() const {
  std::int64_t total = mig_slots > 0 ? mig_milli_left() : 0;
  for (int i = 0; i < gpus; ++i) total += gpu_left[i];
  return total;
}

std::int64_t Node::mig_milli_left() const {
  std::int64_t total = 0;
  for (int k = 0; k < mig_slots; ++k) total += std::max(0, int{mig[k].free}) * mig[k].milli;
  return total;
}

const MigSlot* Node::mig_slot(std::uint8_t profile) const {
  for (int k = 0; k < mig_slots; ++k) {
    if (mig[k].profile == profile) return &mig[k];
  }
  return nullptr;
}

MigSlot* Node::mig_slot(std::uint8_t profile) {
  return const_cast<MigSlot*>(std::as_const(*this).mig_slot(profile));
}

int Node::fully_free_gpus() const {
  int count = 0;
  for (int i = 0; i < gpus; ++i) count += gpu_left[i] == kMilli;
  return count;
}

Cluster::Cluster(const std::vector<NodeSpec>& specs) {
  std::map<std::string, int> model_ids;
  std::map<std::string, std::uint8_t> profile_ids;
  for (const NodeSpec& spec : specs) {
    Node node;
    node.cpu_left = node.cpu_total = spec.cpu_milli;
    node.memory_left = spec.memory_mib;
    node.gpus = spec.gpus;
    if (spec.gpus > 0) {
      auto [it, added] = model_ids.emplace(spec.model, static_cast<int>(models_.size()));
      if (added) {
        if (models_.size() == kMostModels) {
          throw std::invalid_argument(
              fmt::format("more than {} GPU models in one cluster", kMostModels));
        }
        models_.push_back(spec.model);
      }
      node.model = it->second;
    }
    for (int i = 0; i < node.gpus; ++i) node.gpu_left[i] = kMilli;
    node.whole_only = spec.whole_only_gpus;
    gpu_milli_total_ += std::int64_t{spec.gpus} * kMilli;
    for (const MigDevices& devices : spec.mig) {
      if (devices.count < 0) continue;  // 0: a profile the node may be cut into (dynamic MIG)
      auto [it, added] =
          profile_ids.emplace(devices.profile, static_cast<std::uint8_t>(mig_profiles_.size()));
      if (added) {
        if (static_cast<int>(mig_profiles_.size()) == kMostMigProfiles) {
          throw std::invalid_argument(
              fmt::format("more than {} MIG profiles in one cluster", kMostMigProfiles));
        }
        mig_profiles_.push_back(devices.profile);
        mig_profile_milli_.push_back(devices.milli);
      }
      MigSlot* slot = node.mig_slot(it->second);
      if (slot == nullptr) {
        if (node.mig_slots == kMostMigProfilesPerNode) {
          throw std::invalid_argument(fmt::format("node {}: more than {} MIG profiles", spec.name,
                                                  kMostMigProfilesPerNode));
        }
        slot = &node.mig[node.mig_slots++];
        slot->profile = it->second;
        slot->milli = static_cast<std::int16_t>(std::clamp(devices.milli, 1, kMilli));
      }
      // A GPU holds at most 7 devices, a node 16 GPUs.
      constexpr int kMostMigDevicesPerNode = 7 * kMostGpusPerNode;
      slot->total =
          static_cast<std::int16_t>(std::min(slot->total + devices.count, kMostMigDevicesPerNode));
      slot->free = slot->total;
    }
    for (int k = 0; k < node.mig_slots; ++k)
      gpu_milli_total_ += std::int64_t{node.mig[k].total} * node.mig[k].milli;
    nodes_.push_back(node);
  }
}

Request Cluster::request_for(const PodSpec& pod) const {
  Request request;
  request.cpu_milli = pod.cpu_milli;
  request.memory_mib = pod.memory_mib;
  request.gpus = pod.gpus;
  request.gpu_milli = pod.gpu_milli;
  for (const auto& [profile, count] : pod.mig) {
    if (count <= 0) continue;
    if (request.mig_asks == kMostMigAsks) {  // more profiles than one pod may ask: fits nowhere
      request.mig[0] = MigAsk{kUnknownMigProfile, 1};
      break;
    }
    MigAsk& ask = request.mig[request.mig_asks++];
    ask.profile = mig_profile_id(profile);
    ask.count = static_cast<std::int16_t>(std::min(count, 1000));  // more than any node has
  }
  request.kind = kind_of(pod.gpus, pod.gpu_milli, request.mig_asks > 0);
  for (const std::string& model : pod.models) {
    const auto found = std::find(models_.begin(), models_.end(), model);
    // A model no node has still restricts the pod (to nothing, if it is the only one).
    request.models |= found == models_.end() ? (std::uint64_t{1} << kMostModels)
                                             : std::uint64_t{1} << (found - models_.begin());
  }
  return request;
}

std::int64_t Cluster::asked_milli(const Request& request) const {
  std::int64_t milli = std::int64_t{request.gpus} * request.gpu_milli;
  for (int k = 0; k < request.mig_asks; ++k) {
    if (request.mig[k].profile < mig_profile_milli_.size())
      milli += std::int64_t{request.mig[k].count} * mig_profile_milli_[request.mig[k].profile];
  }
  return milli;
}

void Cluster::lend_gpu_to_mig(int node_index, int gpu, bool lend) {
  Node& node = nodes_[static_cast<std::size_t>(node_index)];
  TESSERA_DCHECK(gpu >= 0 && gpu < node.gpus);
  TESSERA_DCHECK(node.gpu_left[gpu] == (lend ? kMilli : 0));  // idle either way
  node.gpu_left[gpu] = static_cast<std::int16_t>(lend ? 0 : kMilli);
  ++node.version;
}

void Cluster::add_mig_devices(int node_index, std::uint8_t profile, int delta) {
  Node& node = nodes_[static_cast<std::size_t>(node_index)];
  MigSlot* slot = node.mig_slot(profile);
  TESSERA_DCHECK(slot != nullptr && slot->free + delta >= 0);
  slot->total = static_cast<std::int16_t>(slot->total + delta);
  slot->free = static_cast<std::int16_t>(slot->free + delta);
  ++node.version;
}

bool Cluster::fits(const Node& node, const Request& request) const {
  if (node.cpu_left < request.cpu_milli || node.memory_left < request.memory_mib) return false;
  if (request.mig_asks > 0 && !mig_fits(node, request)) return false;
  if (request.gpus == 0) return true;
  if (node.gpus == 0 || !node.allows(request.models)) return false;
  int usable = 0;
  for (int i = 0; i < node.gpus; ++i) usable += node.takes(i, request.gpu_milli);
  return usable >= request.gpus;
}

bool Cluster::mig_fits(const Node& node, const Request& request) {
  for (int k = 0; k < request.mig_asks; ++k) {
    const MigSlot* slot = node.mig_slot(request.mig[k].profile);
    if (slot == nullptr || slot->free < request.mig[k].count) return false;
  }
  return true;
}

std::vector<Cluster::CachedScore>& Cluster::fgd_scores_for(const Request& request, Policy policy) {
  std::uint64_t key = 0xcbf29ce484222325ull;
  for (std::uint64_t part :
       {static_cast<std::uint64_t>(request.cpu_milli), static_cast<std::uint64_t>(request.gpus),
        static_cast<std::uint64_t>(request.gpu_milli), request.models,
        static_cast<std::uint64_t>(policy == Policy::fgd_balanced)}) {
    key = (key ^ part) * 0x100000001b3ull;
  }
  for (int k = 0; k < request.mig_asks; ++k) {
    key = (key ^
           ((std::uint64_t{request.mig[k].profile} << 16) | std::uint16_t(request.mig[k].count))) *
          0x100000001b3ull;
  }
  constexpr std::size_t kMostClasses = 4096;  // a long-lived scheduler sees ever new ones
  if (score_cache_.size() >= kMostClasses && !score_cache_.contains(key)) score_cache_.clear();
  std::vector<CachedScore>& scores = score_cache_[key];
  scores.resize(nodes_.size());
  return scores;
}

void Cluster::choose_gpus(const Node& node, const Request& request, int shared_gpu,
                          Placement& placement) const {
  placement.gpu_count = 0;
  if (request.gpus == 0) return;
  if (request.shares_gpu()) {
    int chosen = shared_gpu;
    if (chosen < 0) {  // the tightest GPU that fits
      for (int i = 0; i < node.gpus; ++i) {
        if (node.takes(i, request.gpu_milli) &&
            (chosen < 0 || node.gpu_left[i] < node.gpu_left[chosen])) {
          chosen = i;
        }
      }
    }
    placement.gpu_index[placement.gpu_count++] = chosen;
    return;
  }
  for (int i = 0; i < node.gpus && placement.gpu_count < request.gpus; ++i) {
    if (node.gpu_left[i] == kMilli) placement.gpu_index[placement.gpu_count++] = i;
  }
}

Placement Cluster::place(const Request& request, Policy policy, std::mt19937_64& random) {
  Placement placement;
  Score best;
  int ties = 0;
  const bool by_fgd =
      policy == Policy::fgd || policy == Policy::fgd_packed || policy == Policy::fgd_balanced;
  std::vector<CachedScore>* fgd_scores = by_fgd ? &fgd_scores_for(request, policy) : nullptr;
  for (int index = 0; index < static_cast<int>(nodes_.size()); ++index) {
    const Node& node = nodes_[index];
    if (!fits(node, request)) continue;
    Score candidate;
    if (by_fgd) {
      CachedScore& cached = (*fgd_scores)[index];
      if (!cached.valid || cached.version != node.version) {
        cached = CachedScore{true, node.version, fgd_score(node, request, policy)};
      }
      candidate = cached.score;
      if (placement.node >= 0 && candidate.primary < best.primary - 1e-9) continue;  // cannot win
      if (breaks_ties_by_packing(policy)) candidate.secondary = packing_preference(node, request);
    } else {
      candidate = score(node, request, policy);
    }
    const bool better = placement.node < 0 || candidate.primary > best.primary + 1e-9 ||
                        (std::abs(candidate.primary - best.primary) <= 1e-9 &&
                         candidate.secondary > best.secondary + 1e-12);
    const bool tie = !better && std::abs(candidate.primary - best.primary) <= 1e-9 &&
                     std::abs(candidate.secondary - best.secondary) <= 1e-12;
    if (better) {
      best = candidate;
      placement.node = index;
      ties = 1;
    } else if (tie && policy == Policy::random &&
               std::uniform_int_distribution<int>(0, ties++)(random) == 0) {
      best = candidate;  // any feasible node, each with equal chance
      placement.node = index;
    }  // other policies keep the first of equals, as the paper's simulator placed them
  }
  if (placement.node < 0) return placement;
  const Node& chosen = nodes_[placement.node];
  int shared_gpu = best.gpu;
  if (policy == Policy::random && request.shares_gpu()) {  // any GPU that fits, as the paper ran it
    for (int i = 0, fitting = 0; i < chosen.gpus; ++i) {
      if (chosen.takes(i, request.gpu_milli) &&
          std::uniform_int_distribution<int>(0, fitting++)(random) == 0) {
        shared_gpu = i;
      }
    }
  }
  choose_gpus(chosen, request, shared_gpu, placement);
  return placement;
}

bool Cluster::score_on(int node, const Request& request, Policy policy, double& value) const {
  if (!fits(nodes_[node], request)) return false;
  value = score(nodes_[node], request, policy).primary;
  if (breaks_ties_by_packing(policy)) {
    // Primary scores are whole numbers: the tie-break, squeezed into (-0.4, 0.4), orders
    // equals without overtaking a better primary.
    const double tie = packing_preference(nodes_[node], request);
    value += 0.4 * tie / (1 + std::abs(tie));
  }
  return true;
}

Placement Cluster::place_on(int node, const Request& request, Policy policy,
                            std::mt19937_64& random) {
  Placement placement;
  if (!fits(nodes_[node], request)) return placement;
  placement.node = node;
  int shared_gpu = score(nodes_[node], request, policy).gpu;
  if (policy == Policy::random && request.shares_gpu()) shared_gpu = -1;  // tightest: see place()
  (void)random;
  choose_gpus(nodes_[node], request, shared_gpu, placement);
  return placement;
}

void Cluster::move_room(Node& node, const Request& request, const Placement& placement, int sign) {
  node.cpu_left += sign * request.cpu_milli;
  node.memory_left += sign * request.memory_mib;
  for (int k = 0; k < placement.gpu_count; ++k) {
    std::int16_t& left = node.gpu_left[placement.gpu_index[k]];
    left = static_cast<std::int16_t>(left + sign * request.gpu_milli);
    TESSERA_DCHECK(left >= 0 && left <= kMilli);  // taken where it fit, given back what it took
  }
  take_mig(node, request, sign);
  node.running_by_kind[request.kind] -= sign;
  ++node.version;
}

void Cluster::allocate(const Request& request, const Placement& placement) {
  Node& node = nodes_[placement.node];
  move_room(node, request, placement, -1);
  gpu_milli_allocated_ += std::int64_t{request.gpus} * request.gpu_milli;
  gpu_milli_allocated_ += mig_milli_asked(node, request);
}

void Cluster::release(const Request& request, const Placement& placement) {
  Node& node = nodes_[placement.node];
  move_room(node, request, placement, 1);
  gpu_milli_allocated_ -= std::int64_t{request.gpus} * request.gpu_milli;
  gpu_milli_allocated_ -= mig_milli_asked(node, request);
}

std::int32_t highest_priority(const std::vector<std::size_t>& victims,
                              const std::vector<Occupant>& occupants) {
  std::int32_t most = std::numeric_limits<std::int32_t>::min();
  for (std::size_t i : victims) most = std::max(most, occupants[i].priority);
  return most;
}

// Kubernetes' own way, on the engine's model: take every lower-priority occupant out; if the
// request fits then, give them back one at a time, highest priority first, keeping each that
// leaves the request still fitting. What is not given back is needed. A one-GPU request is
// tried against each GPU in turn (the occupants of other GPUs given back first, so the
// victims gather on that one), and the GPU with the fewest victims, then the lowest
// priorities, wins.
std::optional<std::vector<std::size_t>> Cluster::preemption_victims(
    int node, const Request& request, std::int32_t priority,
    const std::vector<Occupant>& occupants) const {
  const Node& now = nodes_[node];
  if (fits(now, request)) return std::vector<std::size_t>{};
  std::vector<std::size_t> lower;
  Node emptied = now;
  for (std::size_t i = 0; i < occupants.size(); ++i) {
    if (occupants[i].placement.node != node || occupants[i].priority >= priority) continue;
    lower.push_back(i);
    move_room(emptied, occupants[i].request, occupants[i].placement, 1);
  }
  if (!fits(emptied, request)) return std::nullopt;

  auto on_gpu = [&](std::size_t i, int gpu) {
    const Placement& placement = occupants[i].placement;
    return std::find(placement.gpu_index, placement.gpu_index + placement.gpu_count, gpu) !=
           placement.gpu_index + placement.gpu_count;
  };
  // A one-GPU request against each GPU it could use once emptied; any other against the node.
  std::vector<int> targets;
  if (request.gpus == 1) {
    for (int i = 0; i < now.gpus; ++i) {
      if (emptied.takes(i, request.gpu_milli)) targets.push_back(i);
    }
  } else {
    targets.push_back(-1);
  }
  std::optional<std::vector<std::size_t>> best;
  auto worse_than_best = [&](const std::vector<std::size_t>& victims) {
    if (!best) return false;
    if (victims.size() != best->size()) return victims.size() > best->size();
    return highest_priority(victims, occupants) >= highest_priority(*best, occupants);
  };
  for (const int target : targets) {
    std::vector<std::size_t> order = lower;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (occupants[a].priority != occupants[b].priority)
        return occupants[a].priority > occupants[b].priority;
      if (target >= 0 && on_gpu(a, target) != on_gpu(b, target)) return !on_gpu(a, target);
      return occupants[a].request.gpus * occupants[a].request.gpu_milli <
             occupants[b].request.gpus * occupants[b].request.gpu_milli;
    });
    auto still_fits = [&](const Node& state) {
      return fits(state, request) && (target < 0 || state.takes(target, request.gpu_milli));
    };
    Node state = emptied;
    std::vector<std::size_t> victims;
    for (std::size_t i : order) {
      move_room(state, occupants[i].request, occupants[i].placement, -1);
      if (!still_fits(state)) {
        move_room(state, occupants[i].request, occupants[i].placement, 1);
        victims.push_back(i);
      }
    }
    if (!worse_than_best(victims)) best = std::move(victims);
  }
  if (best) std::sort(best->begin(), best->end());
  return best;
}

}  // namespace tessera::sched
