// Dynamic MIG: the layouts of a cluster's MIG-capable GPUs, kept beside the engine's count of
// free MIG devices per node, and changed for a pod that fits nowhere as the GPUs are cut now.
//
// The engine counts MIG devices by profile per node (MigSlot); which GPU instance a pod holds
// and where it sits on its GPU is this class's. A pod that fits nowhere may get room by:
//   - re-cut: a MIG GPU's free instances destroyed and new ones created beside the instances
//     in use (which are never touched), the new layout planned by mig::reconcile;
//   - MIG on: an idle whole GPU put in MIG mode and cut;
//   - MIG off: an idle MIG GPU (no instance in use) made whole again, for pods of whole or
//     shared GPUs.
// Each change has a price, the seconds its GPU (or the new instances) are unavailable. The
// change chosen is the cheapest, then the one leaving the node least fragmented under the
// target workload (Cluster::fragmentation, as placement counts it). The space a re-cut does
// not need for the pod is cut into the profiles the target workload asks most, so the next
// MIG pods find devices without another re-cut.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mig/catalog.h"
#include "mig/planner.h"
#include "sched/engine.h"

namespace tessera::sched {

struct MigPrice {
  double recut_seconds = 5;  // creating (and destroying) GPU instances beside running ones
  double mode_seconds = 30;  // a GPU's MIG mode changed: the whole GPU idle meanwhile
};

struct DynamicMigOptions {
  const mig::GpuModel* model = nullptr;  // every MIG-capable GPU's
  mig::ProfileCounts initial;            // each MIG-capable GPU's layout at start; empty: whole
  bool dynamic = false;                  // false: the layouts stay as they start
  MigPrice price;
};

// MIG profiles by how much a workload asks them (weights sum to 1), most asked first.
using MigProfileWeights = std::vector<std::pair<const mig::Profile*, double>>;

// The weights of the profiles of `model` among `asks` (profile as Kubernetes spells it, count).
MigProfileWeights mig_profile_weights(const mig::GpuModel& model,
                                      const std::vector<std::pair<std::string, int>>& asks);

// The layout a MIG GPU cut as `layout` (instances `in_use` never touched) would get so that
// `missing` fits: its free instances kept where they still fit, the rest cut into `target`'s
// profiles, each toward its share of the slices (so the next pods of those profiles find
// devices without another re-cut). Nullopt when `missing` does not fit beside the instances in
// use, or names a profile the model lacks.
std::optional<mig::Layout> plan_recut(const mig::GpuModel& model, const mig::Layout& layout,
                                      const std::vector<bool>& in_use,
                                      const mig::ProfileCounts& missing,
                                      const MigProfileWeights& target);

// The MIG devices a placed pod holds: (MIG-capable GPU, its GPU instance) pairs. By placement,
// not by index: a re-cut reorders a layout but never moves an instance in use.
using MigHolding = std::vector<std::pair<int, mig::Instance>>;

class DynamicMig {
 public:
  // The nodes as they must be to build the Cluster: every non-media profile of `model` on
  // each node with MIG-capable GPUs (NodeSpec::mig_capable_gpus), none cut yet.
  static std::vector<NodeSpec> with_mig_profiles(std::vector<NodeSpec> nodes,
                                                 const mig::GpuModel& model);
  // Cuts the MIG-capable GPUs of `specs` (as `cluster` was built from with_mig_profiles) as
  // `options.initial` says. Throws std::invalid_argument when that layout does not fit the
  // model, naming it.
  DynamicMig(Cluster& cluster, const std::vector<NodeSpec>& specs, DynamicMigOptions options);

  // The MIG profiles the target workload asks, weighted by how often: what a re-cut fills the
  // rest of its GPU with.
  void set_target_workload(const std::vector<PodSpec>& pods);

  // After cluster.allocate(request, placement): the instances the pod takes, on the node's
  // GPU with the most instances in use (so that others stay free to be re-cut).
  MigHolding take(const Request& request, const Placement& placement);
  // Before cluster.release of the same pod.
  void give_back(const MigHolding& holding);

  // For a request that fits nowhere: applies the cheapest change of cut or mode that lets it
  // fit on one node (the pod is not placed), and returns that node; -1 when none would, or
  // when the layouts are static.
  int make_room(const Request& request);

  long recuts() const { return recuts_; }
  long mode_changes() const { return mode_changes_; }
  double unavailable_gpu_seconds() const { return unavailable_gpu_seconds_; }
  // The instances of MIG-capable GPU `gpu`, for tests and pictures.
  mig::Layout layout(int gpu) const { return gpus_[static_cast<std::size_t>(gpu)].layout; }
  int capable_gpus() const { return static_cast<int>(gpus_.size()); }

 private:
  struct CapableGpu {
    int node = -1;
    int gpu = -1;  // among the node's GPUs
    bool mig = false;
    mig::Layout layout;
    std::vector<bool> in_use;  // by instance
    int used() const;
  };
  struct Change {
    int gpu = -1;        // into gpus_
    bool mode = false;   // MIG mode toggled
    mig::Layout layout;  // the new layout (MIG on or re-cut)
    double seconds = 0;
    double fragmentation = 0;  // of the node after the change and the pod
  };
  // The layout a MIG GPU (or an idle whole one) would get for `missing` beside its instances
  // in use, the rest filled as the target workload asks; empty when they do not fit.
  std::optional<mig::Layout> recut_layout(const CapableGpu& gpu,
                                          const mig::ProfileCounts& missing) const;
  // The node as the engine would see it after `changes` and the pod: for fragmentation.
  Node node_after(const std::vector<Change>& changes, const Request& request) const;
  int make_room_for_mig(const Request& request);
  int make_room_for_gpus(const Request& request);
  void apply(const Change& change);
  void set_layout(CapableGpu& gpu, const mig::Layout& layout, int sign);
  std::uint8_t engine_profile(const mig::Instance& instance) const;

  Cluster& cluster_;
  DynamicMigOptions options_;
  std::vector<CapableGpu> gpus_;
  std::vector<std::vector<int>> gpus_of_node_;  // indices into gpus_
  MigProfileWeights target_;
  std::vector<const mig::Profile*> profile_by_engine_;  // by the engine's profile number
  mutable std::map<std::string, std::optional<mig::Layout>> recut_memo_;
  long recuts_ = 0, mode_changes_ = 0;
  double unavailable_gpu_seconds_ = 0;
};

// Turns `share` of the pods that share one GPU, and fit a profile of at most half the model's
// compute, into pods of the smallest such profile that holds them (seeded): a trace for a
// mixed MIG cluster.
std::vector<PodSpec> with_mig_pods(std::vector<PodSpec> pods, const mig::GpuModel& model,
                                   double share, std::uint64_t seed);

}  // namespace tessera::sched
