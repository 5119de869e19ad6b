// MIG-aware placement on a mixed cluster, against the MIG-blind placement the extender did
// before the engine held MIG devices (its baseline, run on the same arrivals).
//
// The cluster: the openb nodes, every third 8-GPU node with GPUs 4-7 cut as 3g + 2g + 1g + 1g
// (429 + 286 + 143 + 143 milli-GPU). The pods: an openb trace, a share of its sharing pods of
// at most 429 milli turned into a pod of the smallest MIG profile that holds them. Pods arrive
// in a seeded random order until 130 % of the GPU capacity has arrived; each is placed on
// arrival or dropped.
//   aware: the engine holds the devices; every pod placed by fgd-balanced.
//   blind: the engine sees only the shared GPUs; MIG devices are counted beside it, and a MIG
//          pod goes to the node where its profile's devices are most in use (the extender's
//          old packing score); the other pods by fgd-balanced.
// Usage: sched_mig_mixed [TRACE ...]   (default: default gpushare40 gpushare80)
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sched/engine.h"
#include "sched/trace.h"

namespace {

using namespace tessera::sched;

const std::string kData = std::string(TESSERA_SOURCE_DIR) + "/data/openb/";

struct Profile {
  const char* name;
  int milli;
};
constexpr Profile kProfiles[] = {{"1g", 143}, {"2g", 286}, {"3g", 429}};

int milli_of(const std::string& profile) {
  for (const Profile& known : kProfiles) {
    if (profile == known.name) return known.milli;
  }
  return 0;
}

double asked_milli(const PodSpec& pod) {
  double milli = static_cast<double>(pod.gpu_milli_total());
  for (const auto& [profile, count] : pod.mig) milli += count * milli_of(profile);
  return milli;
}

struct Setup {
  std::vector<NodeSpec> nodes;  // with MIG devices
  std::vector<PodSpec> pods;    // with MIG pods
  std::vector<std::size_t> arrivals;
};

Setup make_setup(const std::vector<NodeSpec>& nodes, const std::vector<PodSpec>& trace,
                 double mig_share, std::uint64_t seed) {
  Setup setup{nodes, trace, {}};
  int eight = 0;
  for (NodeSpec& node : setup.nodes) {
    if (node.gpus != 8 || eight++ % 3 != 0) continue;
    node.gpus = 4;
    node.mig = {{"1g", 8, 143}, {"2g", 4, 286}, {"3g", 4, 429}};
  }
  std::mt19937_64 random(seed);
  std::bernoulli_distribution to_mig(mig_share);
  for (PodSpec& pod : setup.pods) {
    if (!pod.shares_gpu() || pod.gpu_milli > 429 || !to_mig(random)) continue;
    for (const Profile& profile : kProfiles) {
      if (pod.gpu_milli <= profile.milli) {
        pod.mig = {{profile.name, 1}};
        break;
      }
    }
    pod.gpus = pod.gpu_milli = 0;
  }
  std::uniform_int_distribution<std::size_t> pick(0, setup.pods.size() - 1);
  for (int k = 0; k < 60000; ++k) setup.arrivals.push_back(pick(random));
  return setup;
}

double aware(const Setup& setup, std::uint64_t seed) {
  Cluster cluster(setup.nodes);
  cluster.set_target_workload(setup.pods);
  const double capacity = static_cast<double>(cluster.gpu_milli_total());
  std::mt19937_64 random(seed);
  double arrived = 0;
  for (std::size_t k : setup.arrivals) {
    if (arrived >= 1.3 * capacity) break;
    arrived += asked_milli(setup.pods[k]);
    const Request request = cluster.request_for(setup.pods[k]);
    const Placement placement = cluster.place(request, Policy::fgd_balanced, random);
    if (placement.node >= 0) cluster.allocate(request, placement);
  }
  return 100 * static_cast<double>(cluster.gpu_milli_allocated()) / capacity;
}

double blind(const Setup& setup, std::uint64_t seed) {
  std::vector<NodeSpec> shared_only = setup.nodes;
  std::vector<std::map<std::string, int>> free(setup.nodes.size()), total(setup.nodes.size());
  double mig_capacity = 0, mig_allocated = 0;
  for (std::size_t n = 0; n < setup.nodes.size(); ++n) {
    for (const MigDevices& devices : setup.nodes[n].mig) {
      free[n][devices.profile] = total[n][devices.profile] = devices.count;
      mig_capacity += devices.count * devices.milli;
    }
    shared_only[n].mig.clear();
  }
  std::vector<PodSpec> cpu_view = setup.pods;  // a MIG pod is its CPU and memory to the engine
  for (PodSpec& pod : cpu_view) pod.mig.clear();
  Cluster cluster(shared_only);
  cluster.set_target_workload(cpu_view);
  const double capacity = static_cast<double>(cluster.gpu_milli_total()) + mig_capacity;
  std::mt19937_64 random(seed);
  double arrived = 0;
  for (std::size_t k : setup.arrivals) {
    if (arrived >= 1.3 * capacity) break;
    const PodSpec& pod = setup.pods[k];
    arrived += asked_milli(pod);
    const Request request = cluster.request_for(cpu_view[k]);
    if (pod.mig.empty()) {
      const Placement placement = cluster.place(request, Policy::fgd_balanced, random);
      if (placement.node >= 0) cluster.allocate(request, placement);
      continue;
    }
    const auto& [profile, count] = pod.mig.front();
    int best = -1;
    double best_share = -1;
    for (std::size_t n = 0; n < setup.nodes.size(); ++n) {
      const auto have = free[n].find(profile);
      if (have == free[n].end() || have->second < count) continue;
      if (!cluster.fits(cluster.nodes()[n], request)) continue;
      const double share =
          static_cast<double>(total[n][profile] - have->second + count) / total[n][profile];
      if (share > best_share + 1e-12) {
        best_share = share;
        best = static_cast<int>(n);
      }
    }
    if (best < 0) continue;
    Placement placement;
    placement.node = best;
    cluster.allocate(request, placement);
    free[static_cast<std::size_t>(best)][profile] -= count;
    mig_allocated += count * milli_of(profile);
  }
  return 100 * (static_cast<double>(cluster.gpu_milli_allocated()) + mig_allocated) / capacity;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> traces = {"default", "gpushare40", "gpushare80"};
  if (argc > 1) traces.assign(argv + 1, argv + argc);
  const std::vector<NodeSpec> nodes = read_nodes(kData + "openb_node_list_gpu_node.csv");
  fmt::print(
      "| trace | MIG pods (share of sharing pods <= 429) | blind | aware | aware - blind |\n");
  fmt::print("|---|---|---|---|---|\n");
  for (const std::string& trace_name : traces) {
    const std::vector<PodSpec> trace = read_pods(kData + "openb_pod_list_" + trace_name + ".csv");
    for (const double share : {0.25, 0.5, 1.0}) {
      std::vector<double> gains;
      double sum_blind = 0, sum_aware = 0;
      for (std::uint64_t seed = 42; seed <= 51; ++seed) {
        const Setup setup = make_setup(nodes, trace, share, seed);
        const double without = blind(setup, seed), with = aware(setup, seed);
        sum_blind += without;
        sum_aware += with;
        gains.push_back(with - without);
      }
      std::sort(gains.begin(), gains.end());
      fmt::print("| {} | {:.0f} % | {:.2f} | {:.2f} | {:+.2f} (seeds: {:+.2f} to {:+.2f}) |\n",
                 trace_name, share * 100, sum_blind / 10, sum_aware / 10,
                 (sum_aware - sum_blind) / 10, gains.front(), gains.back());
    }
  }
  return 0;
}
