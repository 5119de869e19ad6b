#include "sched/dynamic_mig.h"

#include <fmt/core.h>

#include <algorithm>
#include <random>
#include <stdexcept>

namespace tessera::sched {
namespace {

bool servable(const mig::Profile& profile) {
  return !profile.media;
}

// An invariant of this class's bookkeeping: broken, the run's figures would be wrong.
void expect(bool holds, const char* what) {
  if (!holds) throw std::logic_error(std::string("dynamic MIG: ") + what);
}

// A profile's share of its GPU in milli-GPU: its compute slices over the GPU's.
int milli_of(const mig::GpuModel& model, const mig::Profile& profile) {
  return profile.compute_slices >= model.compute_slices
             ? kMilli
             : profile.compute_slices * kMilli / model.compute_slices;
}

mig::Layout in_use_of(const mig::Layout& layout, const std::vector<bool>& in_use) {
  mig::Layout kept;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (in_use[i]) kept.push_back(layout[i]);
  }
  return kept;
}

std::string layout_key(const mig::Layout& layout, const std::vector<bool>& in_use) {
  std::string key;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    key += fmt::format("{}@{}{};", layout[i].profile->name, layout[i].start, in_use[i] ? "*" : "");
  }
  return key;
}

}  // namespace

int DynamicMig::CapableGpu::used() const {
  return static_cast<int>(std::count(in_use.begin(), in_use.end(), true));
}

std::vector<NodeSpec> DynamicMig::with_mig_profiles(std::vector<NodeSpec> nodes,
                                                    const mig::GpuModel& model) {
  for (NodeSpec& node : nodes) {
    if (node.mig_capable_gpus <= 0) continue;
    for (const mig::Profile& profile : model.profiles) {
      if (!servable(profile)) continue;
      const std::string name = mig::resource_profile_name(profile.name);
      const bool listed = std::any_of(node.mig.begin(), node.mig.end(),
                                      [&](const MigDevices& d) { return d.profile == name; });
      if (!listed) node.mig.push_back({name, 0, milli_of(model, profile)});
    }
  }
  return nodes;
}

DynamicMig::DynamicMig(Cluster& cluster, const std::vector<NodeSpec>& specs,
                       DynamicMigOptions options)
    : cluster_(cluster), options_(std::move(options)), gpus_of_node_(specs.size()) {
  expect(options_.model != nullptr, "no GPU model");
  const mig::GpuModel& model = *options_.model;
  profile_by_engine_.assign(std::size_t{kUnknownMigProfile} + 1, nullptr);
  for (const mig::Profile& profile : model.profiles) {
    const std::uint8_t id = cluster_.mig_profile_id(mig::resource_profile_name(profile.name));
    if (servable(profile) && id != kUnknownMigProfile) profile_by_engine_[id] = &profile;
  }
  mig::Layout initial;
  if (!options_.initial.empty()) {
    const mig::Plan plan = mig::place(model, options_.initial);
    if (!plan.found) {
      std::string counts;
      for (const auto& [name, count] : options_.initial)
        counts += fmt::format("{}{}={}", counts.empty() ? "" : ",", name, count);
      throw std::invalid_argument(
          fmt::format("MIG layout '{}' does not fit a {}: {}", counts, model.key, plan.why));
    }
    initial = plan.layout;
  }
  for (std::size_t n = 0; n < specs.size(); ++n) {
    const int capable = std::min(specs[n].mig_capable_gpus, specs[n].gpus);
    for (int g = specs[n].gpus - capable; g < specs[n].gpus; ++g) {
      gpus_of_node_[n].push_back(static_cast<int>(gpus_.size()));
      gpus_.push_back({static_cast<int>(n), g, false, {}, {}});
      if (!initial.empty()) {
        cluster_.lend_gpu_to_mig(static_cast<int>(n), g, true);
        gpus_.back().mig = true;
        set_layout(gpus_.back(), initial, 1);
      }
    }
  }
}

std::uint8_t DynamicMig::engine_profile(const mig::Instance& instance) const {
  return cluster_.mig_profile_id(mig::resource_profile_name(instance.profile->name));
}

void DynamicMig::set_target_workload(const std::vector<PodSpec>& pods) {
  std::vector<std::pair<std::string, int>> asks;
  for (const PodSpec& pod : pods) asks.insert(asks.end(), pod.mig.begin(), pod.mig.end());
  target_ = mig_profile_weights(*options_.model, asks);
  recut_memo_.clear();
}

MigProfileWeights mig_profile_weights(const mig::GpuModel& model,
                                      const std::vector<std::pair<std::string, int>>& asks) {
  std::map<const mig::Profile*, double> asked;
  double total = 0;
  for (const auto& [name, count] : asks) {
    for (const mig::Profile& profile : model.profiles) {
      if (servable(profile) && count > 0 && mig::resource_profile_name(profile.name) == name) {
        asked[&profile] += count;
        total += count;
      }
    }
  }
  MigProfileWeights weights;
  for (const auto& [profile, count] : asked) weights.emplace_back(profile, count / total);
  std::sort(weights.begin(), weights.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  return weights;
}

// Adds (sign 1) or removes (-1) a layout's instances from the engine's counts.
void DynamicMig::set_layout(CapableGpu& gpu, const mig::Layout& layout, int sign) {
  for (const mig::Instance& instance : layout)
    cluster_.add_mig_devices(gpu.node, engine_profile(instance), sign);
  if (sign > 0) {
    gpu.layout = layout;
    gpu.in_use.assign(layout.size(), false);
  } else {
    gpu.layout.clear();
    gpu.in_use.clear();
  }
}

MigHolding DynamicMig::take(const Request& request, const Placement& placement) {
  MigHolding holding;
  const std::vector<int>& here = gpus_of_node_[static_cast<std::size_t>(placement.node)];
  for (int k = 0; k < request.mig_asks; ++k) {
    for (int n = 0; n < request.mig[k].count; ++n) {
      int best_gpu = -1, best_instance = -1;
      for (const int g : here) {
        const CapableGpu& gpu = gpus_[static_cast<std::size_t>(g)];
        for (std::size_t i = 0; i < gpu.layout.size(); ++i) {
          if (gpu.in_use[i] || engine_profile(gpu.layout[i]) != request.mig[k].profile) continue;
          if (best_gpu < 0 || gpu.used() > gpus_[static_cast<std::size_t>(best_gpu)].used()) {
            best_gpu = g;
            best_instance = static_cast<int>(i);
          }
          break;
        }
      }
      expect(best_gpu >= 0, "the engine placed a pod where no instance of its profile is free");
      CapableGpu& chosen = gpus_[static_cast<std::size_t>(best_gpu)];
      chosen.in_use[static_cast<std::size_t>(best_instance)] = true;
      holding.emplace_back(best_gpu, chosen.layout[static_cast<std::size_t>(best_instance)]);
    }
  }
  return holding;
}

void DynamicMig::give_back(const MigHolding& holding) {
  for (const auto& [index, instance] : holding) {
    CapableGpu& gpu = gpus_[static_cast<std::size_t>(index)];
    const auto found = std::find(gpu.layout.begin(), gpu.layout.end(), instance);
    expect(found != gpu.layout.end(), "an instance in use was re-cut away");
    gpu.in_use[static_cast<std::size_t>(found - gpu.layout.begin())] = false;
  }
}

std::optional<mig::Layout> DynamicMig::recut_layout(const CapableGpu& gpu,
                                                    const mig::ProfileCounts& missing) const {
  std::string key = layout_key(gpu.layout, gpu.in_use) + "|";
  for (const auto& [name, count] : missing) key += fmt::format("{}={};", name, count);
  if (const auto found = recut_memo_.find(key); found != recut_memo_.end()) return found->second;
  std::optional<mig::Layout> result =
      plan_recut(*options_.model, gpu.layout, gpu.in_use, missing, target_);
  constexpr std::size_t kMostMemoised = 1 << 16;
  if (recut_memo_.size() >= kMostMemoised) recut_memo_.clear();
  recut_memo_.emplace(key, result);
  return result;
}

std::optional<mig::Layout> plan_recut(const mig::GpuModel& model, const mig::Layout& layout,
                                      const std::vector<bool>& in_use,
                                      const mig::ProfileCounts& missing,
                                      const MigProfileWeights& target) {
  const mig::Layout fixed = in_use_of(layout, in_use);
  mig::ProfileCounts wanted = missing;  // beside `fixed`
  if (!mig::place(model, wanted, fixed).found) return std::nullopt;
  const auto fits_with = [&](const mig::Profile& profile) {
    mig::ProfileCounts more = wanted;
    ++more[profile.name];
    return mig::place(model, more, fixed).found;
  };
  // The free instances it has, where they still fit: keeping them saves steps.
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (!in_use[i] && fits_with(*layout[i].profile)) ++wanted[layout[i].profile->name];
  }
  // The rest in the profiles the target workload asks, each toward its share of the slices.
  std::map<const mig::Profile*, int> slices;
  for (const mig::Instance& instance : fixed)
    slices[instance.profile] += instance.profile->compute_slices;
  for (const auto& [name, count] : wanted) {
    const mig::Profile* profile = model.profile_named(name);
    if (profile == nullptr) return std::nullopt;  // a profile the model lacks
    slices[profile] += count * profile->compute_slices;
  }
  for (bool added = true; added;) {
    added = false;
    const mig::Profile* pick = nullptr;
    double lowest = 0;
    for (const auto& [profile, weight] : target) {
      const double behind = slices[profile] / (weight * profile->compute_slices);
      if ((pick == nullptr || behind < lowest) && fits_with(*profile)) {
        pick = profile;
        lowest = behind;
      }
    }
    if (pick != nullptr) {
      ++wanted[pick->name];
      slices[pick] += pick->compute_slices;
      added = true;
    }
  }
  std::vector<mig::Existing> current;
  for (std::size_t i = 0; i < layout.size(); ++i)
    current.push_back({layout[i], static_cast<unsigned>(i), in_use[i]});
  for (const mig::Instance& instance : fixed) ++wanted[instance.profile->name];
  const mig::Reconciliation plan = mig::reconcile(model, current, wanted, false);
  if (!plan.ok) return std::nullopt;
  return plan.result;
}

Node DynamicMig::node_after(const std::vector<Change>& changes, const Request& request) const {
  expect(!changes.empty(), "no change");
  Node node = cluster_.nodes()[static_cast<std::size_t>(
      gpus_[static_cast<std::size_t>(changes.front().gpu)].node)];
  const auto add = [&](const mig::Layout& layout, int sign) {
    for (const mig::Instance& instance : layout) {
      MigSlot* slot = node.mig_slot(engine_profile(instance));
      slot->total = static_cast<std::int16_t>(slot->total + sign);
      slot->free = static_cast<std::int16_t>(slot->free + sign);
    }
  };
  for (const Change& change : changes) {
    const CapableGpu& gpu = gpus_[static_cast<std::size_t>(change.gpu)];
    if (change.mode && gpu.mig) {  // MIG off: all its instances are free
      add(gpu.layout, -1);
      node.gpu_left[gpu.gpu] = kMilli;
      continue;
    }
    if (change.mode) node.gpu_left[gpu.gpu] = 0;  // MIG on
    mig::Layout gone, made;
    for (std::size_t i = 0; i < gpu.layout.size(); ++i) {
      if (std::find(change.layout.begin(), change.layout.end(), gpu.layout[i]) ==
          change.layout.end())
        gone.push_back(gpu.layout[i]);
    }
    for (const mig::Instance& instance : change.layout) {
      if (std::find(gpu.layout.begin(), gpu.layout.end(), instance) == gpu.layout.end())
        made.push_back(instance);
    }
    add(gone, -1);
    add(made, 1);
  }
  // The pod, as the engine would take it: CPU, memory, its MIG devices, and for GPUs the
  // tightest that takes a share or the whole free ones.
  node.cpu_left -= request.cpu_milli;
  node.memory_left -= request.memory_mib;
  for (int k = 0; k < request.mig_asks; ++k) {
    if (MigSlot* slot = node.mig_slot(request.mig[k].profile)) slot->free -= request.mig[k].count;
  }
  int taken = 0;
  for (int i = 0; i < node.gpus && taken < request.gpus; ++i) {
    if (node.takes(i, request.gpu_milli)) {
      node.gpu_left[i] = static_cast<std::int16_t>(node.gpu_left[i] - request.gpu_milli);
      ++taken;
    }
  }
  return node;
}

int DynamicMig::make_room(const Request& request) {
  if (!options_.dynamic) return -1;
  if (request.mig_asks > 0) return request.gpus > 0 ? -1 : make_room_for_mig(request);
  return request.gpus > 0 ? make_room_for_gpus(request) : -1;
}

int DynamicMig::make_room_for_mig(const Request& request) {
  Request without_mig = request;
  without_mig.mig_asks = 0;
  std::optional<Change> best;
  for (std::size_t n = 0; n < gpus_of_node_.size(); ++n) {
    if (gpus_of_node_[n].empty() || !cluster_.fits(cluster_.nodes()[n], without_mig)) continue;
    const Node& node = cluster_.nodes()[n];
    mig::ProfileCounts missing;
    bool known = true;  // every profile asked is one of the model's
    for (int k = 0; k < request.mig_asks && known; ++k) {
      const std::uint8_t id = request.mig[k].profile;
      const MigSlot* slot = node.mig_slot(id);
      known = slot != nullptr && profile_by_engine_[id] != nullptr;
      const int have = known ? std::max<int>(0, slot->free) : 0;
      if (known && request.mig[k].count > have)
        missing[profile_by_engine_[id]->name] += request.mig[k].count - have;
    }
    if (!known || missing.empty()) continue;
    for (const int g : gpus_of_node_[n]) {
      const CapableGpu& gpu = gpus_[static_cast<std::size_t>(g)];
      const bool idle_whole = !gpu.mig && node.gpu_left[gpu.gpu] == kMilli;
      if (!gpu.mig && !idle_whole) continue;
      const std::optional<mig::Layout> layout = recut_layout(gpu, missing);
      if (!layout) continue;
      Change change{g, idle_whole, *layout,
                    options_.price.recut_seconds + (idle_whole ? options_.price.mode_seconds : 0),
                    0};
      if (best && change.seconds > best->seconds) continue;
      change.fragmentation = cluster_.fragmentation(node_after({change}, request));
      if (!best || change.seconds < best->seconds ||
          change.fragmentation < best->fragmentation - 1e-9) {
        best = change;
      }
    }
  }
  if (!best) return -1;
  apply(*best);
  return gpus_[static_cast<std::size_t>(best->gpu)].node;
}

int DynamicMig::make_room_for_gpus(const Request& request) {
  std::optional<std::vector<Change>> best;
  double best_seconds = 0, best_fragmentation = 0;
  for (std::size_t n = 0; n < gpus_of_node_.size(); ++n) {
    const Node& node = cluster_.nodes()[n];
    if (gpus_of_node_[n].empty() || node.cpu_left < request.cpu_milli ||
        node.memory_left < request.memory_mib || !node.allows(request.models)) {
      continue;
    }
    // The node's idle MIG GPUs made whole, one more at a time, until the pod fits.
    std::vector<Change> changes;
    for (const int g : gpus_of_node_[n]) {
      const CapableGpu& gpu = gpus_[static_cast<std::size_t>(g)];
      if (!gpu.mig || gpu.used() > 0) continue;
      changes.push_back({g, true, {}, options_.price.mode_seconds, 0});
      Node after = node_after(changes, Request{});
      if (!cluster_.fits(after, request)) continue;
      const double seconds = options_.price.mode_seconds * static_cast<double>(changes.size());
      if (best && seconds > best_seconds) break;
      const double fragmentation = cluster_.fragmentation(node_after(changes, request));
      if (!best || seconds < best_seconds || fragmentation < best_fragmentation - 1e-9) {
        best = changes;
        best_seconds = seconds;
        best_fragmentation = fragmentation;
      }
      break;
    }
  }
  if (!best) return -1;
  for (const Change& change : *best) apply(change);
  return gpus_[static_cast<std::size_t>(best->front().gpu)].node;
}

void DynamicMig::apply(const Change& change) {
  CapableGpu& gpu = gpus_[static_cast<std::size_t>(change.gpu)];
  unavailable_gpu_seconds_ += change.seconds;
  if (change.mode && gpu.mig) {  // MIG off
    set_layout(gpu, gpu.layout, -1);
    cluster_.lend_gpu_to_mig(gpu.node, gpu.gpu, false);
    gpu.mig = false;
    ++mode_changes_;
    return;
  }
  if (change.mode) {  // MIG on, then cut
    cluster_.lend_gpu_to_mig(gpu.node, gpu.gpu, true);
    gpu.mig = true;
    ++mode_changes_;
  }
  ++recuts_;
  mig::Layout layout = change.layout;
  std::vector<bool> in_use(layout.size(), false);
  for (std::size_t i = 0; i < gpu.layout.size(); ++i) {
    const auto kept = std::find(layout.begin(), layout.end(), gpu.layout[i]);
    if (kept == layout.end()) {
      expect(!gpu.in_use[i], "a re-cut would destroy an instance in use");
      cluster_.add_mig_devices(gpu.node, engine_profile(gpu.layout[i]), -1);
    } else {
      in_use[static_cast<std::size_t>(kept - layout.begin())] = gpu.in_use[i];
    }
  }
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (std::find(gpu.layout.begin(), gpu.layout.end(), layout[i]) == gpu.layout.end())
      cluster_.add_mig_devices(gpu.node, engine_profile(layout[i]), 1);
  }
  gpu.layout = std::move(layout);
  gpu.in_use = std::move(in_use);
}

std::vector<PodSpec> with_mig_pods(std::vector<PodSpec> pods, const mig::GpuModel& model,
                                   double share, std::uint64_t seed) {
  std::vector<const mig::Profile*> sizes;  // at most half the GPU, smallest first
  for (const mig::Profile& profile : model.profiles) {
    if (servable(profile) && 2 * profile.compute_slices <= model.compute_slices)
      sizes.push_back(&profile);
  }
  std::sort(sizes.begin(), sizes.end(), [](const mig::Profile* a, const mig::Profile* b) {
    return std::tie(a->compute_slices, a->memory_slices) <
           std::tie(b->compute_slices, b->memory_slices);
  });
  std::mt19937_64 random(seed);
  std::bernoulli_distribution to_mig(share);
  for (PodSpec& pod : pods) {
    if (!pod.shares_gpu()) continue;
    const auto holds = std::find_if(sizes.begin(), sizes.end(), [&](const mig::Profile* p) {
      return milli_of(model, *p) >= pod.gpu_milli;
    });
    if (holds == sizes.end() || !to_mig(random)) continue;
    pod.mig = {{mig::resource_profile_name((*holds)->name), 1}};
    pod.gpus = pod.gpu_milli = 0;
    pod.models.clear();
  }
  return pods;
}

}  // namespace tessera::sched
