#include "extender/cluster_state.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "contract/pod_resources.h"
#include "mig/catalog.h"
#include "sched/dynamic_mig.h"

namespace tessera::extender {
namespace {

// Whether two readings of a node differ in anything Tessera uses.
bool same_node(const NodeInfo& a, const NodeInfo& b) {
  return a.spec.cpu_milli == b.spec.cpu_milli && a.spec.memory_mib == b.spec.memory_mib &&
         a.spec.gpus == b.spec.gpus && a.spec.model == b.spec.model &&
         a.gpu_memory_mib == b.gpu_memory_mib && a.spec.whole_only_gpus == b.spec.whole_only_gpus &&
         a.gpu_uuids == b.gpu_uuids && a.spec.mig == b.spec.mig &&
         a.kubelet_counted_gpus == b.kubelet_counted_gpus && a.mig_gpus == b.mig_gpus;
}

// Whether a newer reading of a pod holds what the older one held (a status update).
bool holds_the_same(const Hold& old, const Hold& hold) {
  return old.applied && old.node == hold.node && old.gpus == hold.gpus &&
         old.choose_gpus == hold.choose_gpus && old.pod.cpu_milli == hold.pod.cpu_milli &&
         old.pod.memory_mib == hold.pod.memory_mib && old.pod.gpus == hold.pod.gpus &&
         old.pod.gpumem_mib == hold.pod.gpumem_mib &&
         old.pod.gpumem_percent == hold.pod.gpumem_percent &&
         old.pod.gpucores == hold.pod.gpucores && old.pod.mig == hold.pod.mig;
}

}  // namespace

ClusterState::ClusterState(base::Reporter report)
    : report_(std::move(report)), cluster_(std::make_unique<Cluster>(std::vector<NodeSpec>{})) {}

void ClusterState::say(const std::string& problem) const {
  base::tell(report_, problem);
}

// --- nodes -------------------------------------------------------------------------------------

bool ClusterState::knows(const NodeInfo& info) const {
  const auto known = nodes_.find(info.spec.name);
  return known != nodes_.end() && same_node(known->second, info);
}

void ClusterState::update_nodes(const std::vector<NodeInfo>& infos) {
  for (const NodeInfo& info : infos) nodes_[info.spec.name] = info;
  rebuild();
}

void ClusterState::replace_nodes(std::map<std::string, NodeInfo> nodes) {
  nodes_ = std::move(nodes);
  rebuild();
}

void ClusterState::node_event(const std::string& name, std::optional<NodeInfo> info) {
  const auto known = nodes_.find(name);
  if (info && known != nodes_.end() && same_node(known->second, *info)) {
    return;  // a status update: nothing Tessera uses changed
  }
  if (!info && known == nodes_.end()) return;
  if (info) {
    nodes_[name] = *info;
  } else {
    nodes_.erase(name);
  }
  rebuild();
}

// --- pods --------------------------------------------------------------------------------------

void ClusterState::replace_pods(std::map<std::string, Hold> holds,
                                std::map<std::string, PodRequest> pending, Clock::time_point now) {
  // A list may have been read before this extender's latest binds reached the API server:
  // those stay held a while, unless the list shows them already.
  for (auto bound = own_binds_.begin(); bound != own_binds_.end();) {
    const auto held = holds_.find(bound->first);
    if (now - bound->second > kOwnBindGrace || held == holds_.end()) {
      bound = own_binds_.erase(bound);
      continue;
    }
    holds.try_emplace(bound->first, held->second);
    pending.erase(bound->first);
    ++bound;
  }
  holds_ = std::move(holds);
  pending_ = std::move(pending);
  rebuild();
}

void ClusterState::pod_event(const std::string& uid, bool gone, std::optional<Hold> hold,
                             std::optional<PodRequest> waiting) {
  if (gone) {
    own_binds_.erase(uid);
  } else if (!hold && own_binds_.contains(uid)) {
    return;  // not bound yet: this extender's bind holds its room
  }
  set_pending(uid, std::move(waiting));
  set_hold(uid, std::move(hold));
}

// --- the allocation state ----------------------------------------------------------------------

void ClusterState::rebuild() {
  std::vector<NodeSpec> specs;
  std::set<std::string> models, profiles;
  index_.clear();
  for (const auto& [name, info] : nodes_) {
    NodeSpec spec = info.spec;
    const std::string& node = name;  // a structured binding cannot be captured (C++20)
    std::erase_if(spec.mig, [&](const sched::MigDevices& devices) {
      if (profiles.contains(devices.profile)) return false;
      if (static_cast<int>(profiles.size()) < Cluster::kMostMigProfiles) {
        profiles.insert(devices.profile);
        return false;
      }
      say(
          fmt::format("node {}: MIG profile {} is one more than the {} profiles Tessera places "
                      "on; its devices are not offered",
                      node, devices.profile, Cluster::kMostMigProfiles));
      return true;
    });
    if (spec.gpus > 0 && !models.contains(spec.model)) {
      if (static_cast<int>(models.size()) >= Cluster::kMostModels) {
        say(
            fmt::format("node {}: GPU model {} is one more than the {} models Tessera places on; "
                        "its GPUs are not offered",
                        name, spec.model, Cluster::kMostModels));
        spec.gpus = 0;
        spec.model.clear();
      } else {
        models.insert(spec.model);
      }
    }
    index_[name] = static_cast<int>(specs.size());
    specs.push_back(spec);
  }
  cluster_ = std::make_unique<Cluster>(specs);
  for (auto& [uid, hold] : holds_) {
    hold.applied = false;
    apply(hold);
  }
  measure_workload();
}

void ClusterState::measure_workload() {
  std::vector<Request> requests;
  requests.reserve(holds_.size() + pending_.size());
  for (const auto& [uid, hold] : holds_) {
    if (hold.applied) requests.push_back(hold.request);
  }
  // A pending pod's share of a GPU in MiB is read against the GPU most nodes have.
  std::map<std::int64_t, int> memories;
  for (const auto& [name, info] : nodes_) {
    if (info.gpu_memory_mib > 0) ++memories[info.gpu_memory_mib];
  }
  const auto most =
      std::max_element(memories.begin(), memories.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  const std::int64_t gpu_memory = most == memories.end() ? 0 : most->first;
  for (const auto& [uid, pod] : pending_)
    requests.push_back(request_on(*cluster_, pod, gpu_memory));
  cluster_->set_target_workload(requests);
  workload_pods_ = holds_.size() + pending_.size();
}

void ClusterState::measure_workload_if_moved() {
  const std::size_t now = holds_.size() + pending_.size();
  const std::size_t moved = now > workload_pods_ ? now - workload_pods_ : workload_pods_ - now;
  if (moved >= std::max<std::size_t>(8, workload_pods_ / 10)) measure_workload();
}

void ClusterState::set_pending(const std::string& uid, std::optional<PodRequest> pod) {
  if (pod) {
    pending_[uid] = std::move(*pod);
  } else {
    pending_.erase(uid);
  }
}

void ClusterState::apply(Hold& hold) {
  if (hold.applied) return;
  const auto found = index_.find(hold.node);
  if (found == index_.end()) return;  // its node is unknown or gone
  const NodeInfo& info = nodes_.at(hold.node);
  if (kubelet_counts(info, hold.pod)) {  // the kubelet counts its GPUs: its CPU and memory here
    hold.gpus.clear();
    hold.choose_gpus = false;
  }
  const int gpus_here = cluster_->nodes()[found->second].gpus;
  Request request = request_on(*cluster_, hold.pod, info.gpu_memory_mib);
  request.gpu_milli = std::min(request.gpu_milli, kMilli);  // a GPU is held whole at most
  Placement placement;
  placement.node = found->second;
  const bool recorded_fits =
      !hold.choose_gpus &&
      std::all_of(hold.gpus.begin(), hold.gpus.end(), [&](int gpu) { return gpu < gpus_here; });
  if (recorded_fits) {  // the recorded GPUs are the ones the pod was given
    for (int gpu : hold.gpus) placement.gpu_index[placement.gpu_count++] = gpu;
    request.gpus = placement.gpu_count;
    if (request.gpus == 0) request.gpu_milli = 0;
  } else if (request.gpus > 0) {
    placement = cluster_->place_on(found->second, request, Policy::best_fit, random_);
    if (placement.node < 0) {
      say(
          fmt::format("pod {}/{} runs on {} without a usable record of its GPUs, and no room is "
                      "left there to hold for it",
                      hold.pod.namespace_name, hold.pod.name, hold.node));
      return;
    }
  }
  cluster_->allocate(request, placement);
  hold.request = request;
  hold.placement = placement;
  hold.applied = true;
}

void ClusterState::release(Hold& hold) {
  if (!hold.applied) return;
  cluster_->release(hold.request, hold.placement);
  hold.applied = false;
}

void ClusterState::set_hold(const std::string& uid, std::optional<Hold> hold) {
  const auto existing = holds_.find(uid);
  if (existing != holds_.end()) {
    if (hold && holds_the_same(existing->second, *hold)) {
      return;  // a status update: nothing held changes
    }
    release(existing->second);
    holds_.erase(existing);
  }
  if (hold) {
    apply(*hold);
    holds_.emplace(uid, std::move(*hold));
  }
  measure_workload_if_moved();
}

std::string ClusterState::lasting_refusal(const PodRequest& pod, const std::string& node,
                                          Request& request, int& index) const {
  const auto found = index_.find(node);
  if (found == index_.end()) return "node unknown to Tessera";
  index = found->second;
  const NodeInfo& info = nodes_.at(node);
  if (kubelet_counts(info, pod)) {  // its replicas are the kubelet's to count: CPU and memory here
    PodRequest host_only = pod;
    host_only.gpus = 0;
    request = request_on(*cluster_, host_only, info.gpu_memory_mib);
    return {};
  }
  if (pod.gpus > 0) {
    if (cluster_->nodes()[index].gpus == 0)
      return fmt::format("node has no GPUs Tessera knows of ({})", kGpusAnnotation);
    if (std::string why = model_refusal(pod, info.spec.model); !why.empty()) return why;
  }
  std::vector<std::string> asked;
  for (const auto& [profile, count] : pod.mig) {
    if (count > 0) asked.push_back(std::string(contract::kMigResourcePrefix) + profile);
  }
  if (asked.size() > static_cast<std::size_t>(sched::kMostMigAsks)) {
    return fmt::format("asks for {} MIG profiles ({}); a pod may ask for at most {}", asked.size(),
                       fmt::join(asked, ", "), sched::kMostMigAsks);
  }
  request = request_on(*cluster_, pod, info.gpu_memory_mib);
  if (request.gpu_milli > kMilli) {
    return fmt::format("asks for {} MiB of GPU memory; a GPU here has {} MiB", pod.gpumem_mib,
                       info.gpu_memory_mib);
  }
  return {};
}

std::optional<MigRecut> ClusterState::plan_mig_recut(const PodRequest& pod,
                                                     const std::vector<std::string>& nodes) const {
  if (pod.mig.empty() || pod.gpus > 0) return std::nullopt;
  // What the rest of a re-cut GPU is cut into: the profiles the MIG pods held and waiting ask.
  std::vector<std::pair<std::string, int>> asks(pod.mig.begin(), pod.mig.end());
  for (const auto& [uid, hold] : holds_)
    asks.insert(asks.end(), hold.pod.mig.begin(), hold.pod.mig.end());
  for (const auto& [uid, waiting] : pending_)
    asks.insert(asks.end(), waiting.mig.begin(), waiting.mig.end());
  std::optional<MigRecut> best;
  for (const std::string& name : nodes) {
    Request request;
    int index = -1;
    if (!lasting_refusal(pod, name, request, index).empty()) continue;
    const NodeInfo& info = nodes_.at(name);
    Request host_only = request;
    host_only.mig_asks = 0;
    if (info.mig_gpus.empty() || !cluster_->fits(cluster_->nodes()[index], host_only)) continue;
    for (const MigGpuLayout& gpu : info.mig_gpus) {
      const mig::GpuModel* model = mig::find_model(gpu.model);
      if (model == nullptr) continue;
      mig::ProfileCounts missing;
      bool known = true;
      for (const auto& asked : pod.mig) {
        const std::string& profile = asked.first;  // a lambda cannot capture a binding (C++20)
        const int short_by = asked.second - std::max(0, cluster_->mig_free(index, profile));
        if (short_by <= 0) continue;
        const auto named = std::find_if(
            model->profiles.begin(), model->profiles.end(),
            [&](const mig::Profile& p) { return mig::resource_profile_name(p.name) == profile; });
        known = known && named != model->profiles.end();
        if (known) missing[named->name] += short_by;
      }
      mig::Layout layout;
      std::vector<bool> held;
      for (const MigGpuLayout::Instance& instance : gpu.instances) {
        const mig::Profile* profile = model->profile_named(instance.profile);
        known = known && profile != nullptr;
        if (profile != nullptr) layout.push_back({profile, instance.start});
        held.push_back(instance.held);
      }
      if (!known || missing.empty()) continue;
      const std::optional<mig::Layout> cut = sched::plan_recut(
          *model, layout, held, missing, sched::mig_profile_weights(*model, asks));
      if (!cut) continue;
      const int destroyed = static_cast<int>(
          std::count_if(layout.begin(), layout.end(), [&](const mig::Instance& instance) {
            return std::find(cut->begin(), cut->end(), instance) == cut->end();
          }));
      if (!best || destroyed < best->destroyed)
        best = MigRecut{name, gpu.index, mig::counts_of(*cut), destroyed};
    }
  }
  return best;
}

std::string ClusterState::refusal(const PodRequest& pod, const std::string& node, Request& request,
                                  int& index) const {
  if (std::string why = lasting_refusal(pod, node, request, index); !why.empty()) return why;
  const sched::Node& now = cluster_->nodes()[index];
  if (kubelet_counts(nodes_.at(node), pod)) {
    return cluster_->fits(now, request) ? std::string() : "not enough CPU or memory";
  }
  for (const auto& [profile, count] : pod.mig) {
    const int free = cluster_->mig_free(index, profile);
    if (free < count) {
      return fmt::format("has {} nvidia.com/mig-{} free; asks {}", std::max(free, 0), profile,
                         count);
    }
  }
  if (!cluster_->fits(now, request)) {
    if (pod.gpus == 0) return "not enough CPU or memory";
    return fmt::format("no room for {} GPU(s) of {} milli-GPU (or for the CPU and memory)",
                       request.gpus, request.gpu_milli);
  }
  return {};
}

std::vector<std::optional<std::vector<std::string>>> ClusterState::preemption_victims(
    const PodRequest& pod, const std::vector<std::string>& nodes) const {
  std::vector<std::optional<std::vector<std::string>>> answers(nodes.size());
  // The holds of the asked nodes, in one pass.
  std::map<std::string, std::size_t> asked;
  for (std::size_t k = 0; k < nodes.size(); ++k) asked.emplace(nodes[k], k);
  std::vector<std::vector<sched::Occupant>> occupants(nodes.size());
  std::vector<std::vector<const std::string*>> uids(nodes.size());
  for (const auto& [uid, hold] : holds_) {
    const auto found = asked.find(hold.node);
    if (!hold.applied || found == asked.end()) continue;
    occupants[found->second].push_back({hold.request, hold.placement, hold.pod.priority});
    uids[found->second].push_back(&uid);
  }
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    Request request;
    int index = -1;
    // What no eviction changes (an unknown node, its GPUs, model and memory) rules it out;
    // the rest is room, which the engine weighs with the victims.
    if (!lasting_refusal(pod, nodes[k], request, index).empty()) continue;
    const auto chosen = cluster_->preemption_victims(index, request, pod.priority, occupants[k]);
    if (!chosen) continue;
    std::vector<std::string> victims;
    for (std::size_t i : *chosen) victims.push_back(*uids[k][i]);
    answers[k] = std::move(victims);
  }
  return answers;
}

std::optional<double> ClusterState::score(const PodRequest& pod, const std::string& node,
                                          Policy policy) const {
  Request request;
  int index = -1;
  double score = 0;
  if (!refusal(pod, node, request, index).empty() ||
      !cluster_->score_on(index, request, policy, score)) {
    return std::nullopt;
  }
  return score;
}

std::optional<Reservation> ClusterState::reserve(const std::string& uid, const PodRequest& pod,
                                                 const std::string& node, Policy policy,
                                                 Clock::time_point now, std::string& why) {
  if (const auto stale = holds_.find(uid); stale != holds_.end()) {
    release(stale->second);  // an earlier attempt's: this one replaces it
    holds_.erase(stale);
  }
  Request request;
  int index = -1;
  why = refusal(pod, node, request, index);
  if (!why.empty()) return std::nullopt;
  Hold hold;
  hold.node = node;
  hold.pod = pod;
  hold.placement = cluster_->place_on(index, request, policy, random_);
  Reservation reserved;
  for (int k = 0; k < hold.placement.gpu_count; ++k)
    reserved.gpus.push_back(hold.placement.gpu_index[k]);
  hold.gpus = reserved.gpus;
  hold.request = request;
  reserved.gpu_milli = request.gpu_milli;
  reserved.node_uuids = nodes_.at(node).gpu_uuids;
  // Held now, so that concurrent binds cannot take the same room.
  cluster_->allocate(request, hold.placement);
  hold.applied = true;
  holds_[uid] = std::move(hold);
  pending_.erase(uid);  // held now, not waiting
  own_binds_[uid] = now;
  measure_workload_if_moved();
  return reserved;
}

void ClusterState::give_back(const std::string& uid) {
  own_binds_.erase(uid);
  if (const auto held = holds_.find(uid); held != holds_.end()) {
    release(held->second);
    holds_.erase(held);
  }
}

StateSize ClusterState::size() const {
  StateSize state;
  state.nodes = nodes_.size();
  state.pods_held =
      static_cast<std::size_t>(std::count_if(holds_.begin(), holds_.end(), [](const auto& entry) {
        const Hold& hold = entry.second;
        return hold.pod.gpus > 0 || !hold.pod.mig.empty();
      }));
  state.pods_waiting = pending_.size();
  return state;
}

}  // namespace tessera::extender
