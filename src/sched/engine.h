// The placement engine: a cluster model (nodes with CPU, memory and GPUs by model; each GPU's
// free milli-GPU), pod requests, feasibility, scoring by policy, and the choice of GPUs on
// the chosen node. The simulator and the scheduler extender both place through it.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "sched/model.h"

namespace tessera::sched {

enum class Policy {
  random,          // any feasible node
  best_fit,        // least leftover CPU and GPU, each relative to the largest node
  dot_product,     // Tetris: alignment of the node's free vector with the request
  gpu_packing,     // a partly used GPU, then a free GPU on a used node, then an idle node
  gpu_clustering,  // nodes already running pods of the same kind
  spread,          // the emptiest node
  fgd,             // fragmentation gradient descent (Weng et al., ATC'23), as published
  fgd_packed,      // Tessera's: FGD's score, its ties broken by packing (packing_preference)
  fgd_balanced,    // Tessera's: fgd_packed, counting GPUs their node's CPU can no longer feed,
                   // and a model's GPUs as no fragment for pods that may not use it but as
                   // reserved for them against pods that could go elsewhere
};

// Parses "fgd", "best-fit", ...; throws std::invalid_argument naming the known ones.
Policy parse_policy(const std::string& name);
std::string policy_name(Policy policy);
const std::vector<Policy>& all_policies();

// MIG: profiles are numbered per cluster; a node holds devices of a few of them, a pod asks
// for a few.
inline constexpr int kMostMigProfilesPerNode = 8;
inline constexpr int kMostMigAsks = 4;
inline constexpr std::uint8_t kUnknownMigProfile = 255;  // a profile no node has: fits nowhere

struct MigAsk {
  std::uint8_t profile = kUnknownMigProfile;
  std::int16_t count = 0;
};

// A pod's request as the engine works with it.
struct Request {
  std::int64_t cpu_milli = 0;
  std::int64_t memory_mib = 0;
  int gpus = 0;
  int gpu_milli = 0;         // per GPU
  std::uint64_t models = 0;  // bit per allowed model; 0: any
  int kind = 0;              // for clustering: 0 CPU, 1 sharing, 2-5 whole GPUs, 6 MIG
  MigAsk mig[kMostMigAsks];  // MIG devices by profile, besides `gpus`
  int mig_asks = 0;
  bool shares_gpu() const { return gpus == 1 && gpu_milli < kMilli; }
  bool asks_gpu() const { return gpus > 0 || mig_asks > 0; }
};

// A node's MIG devices of one profile.
struct MigSlot {
  std::uint8_t profile = kUnknownMigProfile;
  std::int16_t free = 0;  // below 0 when holds overcommit it (pods placed by others)
  std::int16_t total = 0;
  std::int16_t milli = 0;  // each device's share of its GPU
};

struct Node {
  std::int64_t cpu_left = 0, memory_left = 0;
  std::int64_t cpu_total = 0;
  int gpus = 0;
  int model = -1;  // index into the cluster's models; -1 for a CPU-only node
  std::int16_t gpu_left[kMostGpusPerNode] = {};
  std::uint16_t whole_only = 0;  // GPUs that take only whole-GPU requests (NodeSpec)
  int running_by_kind[8] = {};
  std::uint32_t version = 0;  // changes whenever the node's allocations do
  int mig_slots = 0;
  MigSlot mig[kMostMigProfilesPerNode];  // last: most nodes have none, and place() reads the rest
  // Free milli-GPU: the GPUs' and the free MIG devices'.
  std::int64_t gpu_milli_left() const;
  std::int64_t mig_milli_left() const;
  // The node's slot of a MIG profile, or null.
  const MigSlot* mig_slot(std::uint8_t profile) const;
  MigSlot* mig_slot(std::uint8_t profile);
  int fully_free_gpus() const;
  // Whether a request limited to `models` (a bit per model index; 0: any) may use this node.
  bool allows(std::uint64_t models) const {
    return models == 0 || (model >= 0 && (models >> model) & 1u);
  }
  // Whether GPU i can take `milli` of a request now: room, and sharing allowed for a part.
  bool takes(int i, int milli) const {
    return gpu_left[i] >= milli && (milli >= kMilli || ((whole_only >> i) & 1u) == 0);
  }
};

struct Placement {
  int node = -1;  // -1: nowhere fits
  int gpu_count = 0;
  int gpu_index[kMostGpusPerNode] = {};
};

// A pod running on a node, as preemption weighs it: what it holds and its priority
// (Kubernetes' spec.priority: higher wins).
struct Occupant {
  Request request;
  Placement placement;
  std::int32_t priority = 0;
};

// The highest priority among `victims` (indices into `occupants`); the least int32 for none.
// Between two choices of as many victims, the lower highest priority is the better.
std::int32_t highest_priority(const std::vector<std::size_t>& victims,
                              const std::vector<Occupant>& occupants);

// The target workload FGD measures fragmentation against: task classes by popularity.
struct TaskClass {
  Request request;
  double weight = 0;  // popularity, the classes' weights sum to 1
};

class Cluster {
 public:
  // GPU models a cluster may have: one bit each in Request::models, and one bit for
  // models no node has.
  static constexpr int kMostModels = 63;
  static constexpr int kMostMigProfiles = kUnknownMigProfile;

  // Throws std::invalid_argument if the nodes have more than kMostModels GPU models, more than
  // kMostMigProfiles MIG profiles, or a node more than kMostMigProfilesPerNode of them.
  explicit Cluster(const std::vector<NodeSpec>& nodes);

  Request request_for(const PodSpec& pod) const;
  bool fits(const Node& node, const Request& request) const;
  // The best node and GPUs for request under policy, or node -1. Among equals the first node
  // wins (under `random`, any feasible node with equal chance).
  Placement place(const Request& request, Policy policy, std::mt19937_64& random);
  // The same decision restricted to one node: its score (higher is better; the policy's
  // tie-break included, as place() ranks nodes) if the request fits there, and the GPUs it
  // would get.
  bool score_on(int node, const Request& request, Policy policy, double& score) const;
  Placement place_on(int node, const Request& request, Policy policy, std::mt19937_64& random);
  void allocate(const Request& request, const Placement& placement);
  void release(const Request& request, const Placement& placement);
  // Preemption on one node: the fewest of `occupants` (those placed on `node`) of priority
  // below `priority` whose removal lets `request` fit there, preferring the lowest priorities.
  // Indices into `occupants`; empty if the request fits as it is; nullopt if removing every
  // such occupant would not make it fit.
  // A one-GPU request frees one GPU: the one that needs the fewest victims.
  // Each victim is needed: given the rest back, the request would no longer fit.
  std::optional<std::vector<std::size_t>> preemption_victims(
      int node, const Request& request, std::int32_t priority,
      const std::vector<Occupant>& occupants) const;

  // FGD's target workload: the task classes of `pods` (CPU-only ones included) covering
  // `coverage` of them by count, weighted by popularity.
  void set_target_workload(const std::vector<PodSpec>& pods, double coverage = 0.95);
  // The same from requests in the engine's terms (the extender's: the pods it holds).
  void set_target_workload(const std::vector<Request>& requests, double coverage = 0.95);
  // Free MIG devices of `profile` (as Kubernetes spells it) on a node; 0 where it has none.
  int mig_free(int node, const std::string& profile) const;
  // A profile's number in this cluster, or kUnknownMigProfile if no node has it.
  std::uint8_t mig_profile_id(const std::string& profile) const;
  // The milli-GPU a request asks for: its GPUs' and its MIG devices' (as the cluster cuts them).
  std::int64_t asked_milli(const Request& request) const;
  // Changing how a node's GPUs are cut (dynamic MIG, dynamic_mig.h owns the why):
  // GPU `gpu`, idle, leaves the shared GPUs for MIG (its milli is then its devices'), or comes
  // back whole once its devices are gone;
  void lend_gpu_to_mig(int node, int gpu, bool lend);
  // `delta` free MIG devices of a profile the node was built with (NodeSpec::mig, a count of
  // 0 included) appear, or go.
  void add_mig_devices(int node, std::uint8_t profile, int delta);
  // Fragmented milli-GPU of a node, or of the whole cluster, under the target workload: for
  // each class, the free GPU milli and MIG devices it cannot use, weighted by popularity.
  double fragmentation(const Node& node) const {
    return fragmentation(node, ForeignModels::fragmented);
  }
  double fragmentation() const;
  // Free milli-GPU of a node that its CPU left cannot feed at the target workload's CPU per
  // milli-GPU: what fgd_balanced adds to FGD's fragmentation.
  double stranded_gpu(const Node& node) const;

  const std::vector<Node>& nodes() const { return nodes_; }
  std::int64_t gpu_milli_total() const { return gpu_milli_total_; }
  std::int64_t gpu_milli_allocated() const { return gpu_milli_allocated_; }

 private:
  // How a class restricted to GPU models a node lacks sees that node's free GPU: as
  // fragmented (FGD's measure), or as none of its concern (fgd_balanced's: the GPU is not
  // wasted, it is only not that class's; counting it drives the other pods onto the scarce
  // models the restricted pods need).
  enum class ForeignModels { fragmented, ignored };
  double fragmentation(const Node& node, ForeignModels foreign) const;
  // What fgd_balanced charges a pod that could run on other models for taking GPUs of a model
  // the target workload's restricted pods need: its milli-GPU times model_reserved_.
  double reservation_cost(const Node& node, const Request& request) const;
  void measure_model_reservations(const std::vector<Request>& requests);
  std::uint64_t existing_models() const { return (std::uint64_t{1} << models_.size()) - 1; }
  struct Score {
    double primary = 0;    // higher is better
    double secondary = 0;  // breaks ties in primary (fgd_packed and fgd_balanced only)
    int gpu = -1;          // for a sharing pod: the GPU to use
  };
  Score score(const Node& node, const Request& request, Policy policy) const;
  Score fgd_score(const Node& node, const Request& request, Policy policy) const;
  static bool mig_fits(const Node& node, const Request& request);
  static double packing_preference(const Node& node, const Request& request);
  // The free GPU milli of the node that a pod of `request` could use (0 if it does not fit).
  static std::int64_t usable_by(const Node& node, const Request& request);
  // The share of the node's devices of the asked MIG profiles in use once the pod is placed
  // (0 to 1, averaged over the profiles): higher packs tighter.
  static double mig_packing(const Node& node, const Request& request);
  // Milli-GPU of the MIG devices the request asks for, as the node cuts them.
  static std::int64_t mig_milli_asked(const Node& node, const Request& request);
  // The MIG devices the request asks for, taken from (sign -1) or given back to (1) the node.
  static void take_mig(Node& node, const Request& request, int sign);
  // The node's side of allocate (sign -1) and release (1).
  static void move_room(Node& node, const Request& request, const Placement& placement, int sign);
  void choose_gpus(const Node& node, const Request& request, int shared_gpu,
                   Placement& placement) const;

  // FGD scores by request class, then by node; an entry holds while its node's version is
  // unchanged: requests fall into few classes, and most nodes do not change between two
  // decisions.
  struct CachedScore {
    bool valid = false;
    std::uint32_t version = 0;
    Score score;
  };
  std::vector<CachedScore>& fgd_scores_for(const Request& request, Policy policy);

  std::vector<Node> nodes_;
  std::unordered_map<std::uint64_t, std::vector<CachedScore>> score_cache_;
  std::vector<std::string> models_;
  std::vector<std::string> mig_profiles_;
  std::vector<int> mig_profile_milli_;  // as the first node with the profile cuts it
  std::vector<TaskClass> classes_;
  double cpu_per_gpu_milli_ = 0;  // the target workload's GPU pods: CPU they ask per milli-GPU
  // By model: the share of its GPUs that the target workload's pods restricted to it would
  // need (their share of the GPU asked over the model's share of the GPUs), at most 1.
  std::vector<double> model_reserved_;
  // Fragmentation by node state, filled by const methods, which the extender calls from
  // several threads at once. A cache: a copied or moved cluster starts with an empty one.
  struct FragmentationMemo {
    FragmentationMemo() = default;
    FragmentationMemo(const FragmentationMemo&) {}
    FragmentationMemo& operator=(const FragmentationMemo&) {
      base::MutexLock locked(mutex);
      values.clear();
      return *this;
    }
    base::Mutex mutex;
    std::unordered_map<std::uint64_t, double> values GUARDED_BY(mutex);
  };
  mutable FragmentationMemo fragmentation_memo_;
  std::int64_t gpu_milli_total_ = 0;
  std::int64_t gpu_milli_allocated_ = 0;
};

}  // namespace tessera::sched
