// What the extender knows of the cluster, in the placement engine's terms: the nodes, what
// each pod holds, which pods wait for a node, and this extender's own binds. Pure: no HTTP,
// no API server and no lock (the extender holds its own around it), so every decision it
// makes is tested alone (tests/extender/extender_state_test.cpp).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/log.h"
#include "extender/cluster_objects.h"
#include "extender/metrics.h"
#include "kube/reflector.h"
#include "mig/planner.h"
#include "sched/engine.h"

namespace tessera::extender {

using sched::Placement;
using sched::Policy;

// What a pod holds on a node, and what of it is applied to the cluster model.
struct Hold {
  std::string node;
  PodRequest pod;
  std::vector<int> gpus;     // as recorded; empty with choose_gpus
  bool choose_gpus = false;  // no usable record: the engine picks GPUs to hold
  bool applied = false;
  Request request;
  Placement placement;
};

// The room a bind holds for its pod until the pod is bound (or the bind fails).
struct Reservation {
  std::vector<int> gpus;  // in the engine's numbering
  int gpu_milli = 0;
  std::vector<std::string> node_uuids;  // the node's GPUs' UUIDs, in that numbering
};

// A MIG GPU's new cut: what the node's tessera.io/mig-layout annotation asks for.
struct MigRecut {
  std::string node;
  int gpu = 0;                // the node's GPU index
  mig::ProfileCounts layout;  // its instances by profile, as NVML names them
  int destroyed = 0;          // free instances it destroys
};

class ClusterState {
 public:
  using Clock = std::chrono::steady_clock;
  // `report` hears of what cannot be offered or held (never throws; may be empty).
  explicit ClusterState(base::Reporter report = {});

  // --- nodes
  // Whether `info` is the node as known (a status update changes nothing Tessera uses).
  bool knows(const NodeInfo& info) const;
  // Nodes as kube-scheduler sent them: each replaces what was known of it.
  void update_nodes(const std::vector<NodeInfo>& infos);
  // Every node, as listed.
  void replace_nodes(std::map<std::string, NodeInfo> nodes);
  // One node added, changed (info) or deleted (nullopt).
  void node_event(const std::string& name, std::optional<NodeInfo> info);

  // --- pods
  // Every pod, as listed: what each holds, and those waiting for a node. This extender's binds
  // of the last minute stay held where a list read before they landed does not show them.
  void replace_pods(std::map<std::string, Hold> holds, std::map<std::string, PodRequest> pending,
                    Clock::time_point now);
  // One pod added or changed (its hold or its wait), or gone (deleted or finished).
  void pod_event(const std::string& uid, bool gone, std::optional<Hold> hold,
                 std::optional<PodRequest> waiting);

  // --- decisions
  // Why `pod` cannot go to `node` (empty if it can); fills `request` and `index` for it.
  std::string refusal(const PodRequest& pod, const std::string& node, Request& request,
                      int& index) const;
  // The part of refusal that no eviction changes: an unknown node, no GPUs, another model, too
  // many MIG profiles, more GPU memory than a GPU has. Fills `request` and `index` when empty.
  std::string lasting_refusal(const PodRequest& pod, const std::string& node, Request& request,
                              int& index) const;
  // The engine's score for `pod` on `node` under `policy`; nullopt where it does not fit.
  std::optional<double> score(const PodRequest& pod, const std::string& node, Policy policy) const;
  // Holds room for this extender's bind of pod `uid` on `node` (replacing an earlier attempt's);
  // nullopt with `why` where it no longer fits.
  std::optional<Reservation> reserve(const std::string& uid, const PodRequest& pod,
                                     const std::string& node, Policy policy, Clock::time_point now,
                                     std::string& why);
  // Preemption, for each of `nodes`: the pods there (by UID) of priority below `pod`'s whose
  // removal lets it fit, the fewest, of the lowest priorities, freeing one GPU for a one-GPU
  // pod (Cluster::preemption_victims); none if it fits as it is; nullopt where no such pods
  // would make room (or the node cannot take the pod at all, or is unknown). One pass over
  // the holds, however many nodes.
  std::vector<std::optional<std::vector<std::string>>> preemption_victims(
      const PodRequest& pod, const std::vector<std::string>& nodes) const;
  // Dynamic MIG, for a MIG pod that fits on none of `nodes` as their GPUs are cut: the re-cut of
  // one MIG GPU, on a node whose CPU and memory take the pod, that lets its profiles fit beside
  // the instances pods hold (sched::plan_recut), destroying the fewest free instances, the rest
  // of the GPU cut as the MIG pods held and waiting ask; nullopt where none would. Only GPUs
  // whose node agent says where each instance sits and whether it is held are planned.
  std::optional<MigRecut> plan_mig_recut(const PodRequest& pod,
                                         const std::vector<std::string>& nodes) const;
  // A bind that failed: its room is free again.
  void give_back(const std::string& uid);

  StateSize size() const;  // `leading` is the extender's to say

 private:
  // The cluster model from nodes_, with every hold applied: after nodes change or a relist.
  void rebuild();
  void apply(Hold& hold);
  void release(Hold& hold);
  void set_hold(const std::string& uid, std::optional<Hold> hold);
  void set_pending(const std::string& uid, std::optional<PodRequest> pod);
  // FGD's target workload is the pods held now and those waiting for a node: measured after a
  // rebuild, and again whenever their count has moved by a tenth (at least 8) since.
  void measure_workload();
  void measure_workload_if_moved();
  void say(const std::string& problem) const;

  base::Reporter report_;
  std::map<std::string, NodeInfo> nodes_;
  std::map<std::string, Hold> holds_;  // by pod UID
  // This extender's binds, by pod UID, and when: held across a list read before they landed.
  std::map<std::string, Clock::time_point> own_binds_;
  static constexpr std::chrono::seconds kOwnBindGrace{60};
  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, int> index_;
  std::mt19937_64 random_{42};
  std::map<std::string, PodRequest> pending_;  // pods waiting for a node, by UID
  std::size_t workload_pods_ = 0;  // holds and pending pods when the workload was last measured
};

}  // namespace tessera::extender
