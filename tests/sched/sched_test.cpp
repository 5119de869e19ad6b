// The placement engine and the trace reader: feasibility, each policy's defining choice,
// FGD's fragmentation measure, determinism by seed, and malformed traces.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <set>

#include "sched/experiment.h"
#include "sched/trace_generator.h"
#include "support.h"

namespace tessera::sched {
namespace {

using test::ScratchDirectory;

std::string write(const ScratchDirectory& scratch, const std::string& name,
                  const std::string& text) {
  const std::string path = scratch.file(name);
  std::ofstream(path) << text;
  return path;
}

// Node and pod lists in the openb format, written below their headers and read back.
std::vector<NodeSpec> node_list(const ScratchDirectory& scratch, const std::string& rows) {
  return read_nodes(write(scratch, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\n" + rows));
}
std::vector<PodSpec> pod_list(const ScratchDirectory& scratch, const std::string& name,
                              const std::string& rows) {
  return read_pods(
      write(scratch, name, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + rows));
}

std::vector<NodeSpec> two_nodes() {
  // node 0: 2 T4s; node 1: 8 V100s.
  return {{"n0", 32000, 131072, 2, "T4"}, {"n1", 96000, 393216, 8, "V100M32"}};
}

PodSpec pod(std::int64_t cpu, int gpus, int milli, std::vector<std::string> models = {}) {
  PodSpec spec;
  spec.name = "p";
  spec.cpu_milli = cpu;
  spec.memory_mib = 1024;
  spec.gpus = gpus;
  spec.gpu_milli = milli;
  spec.models = std::move(models);
  return spec;
}

// A placement on `node`, on GPU 0.
Placement on_gpu_0_of(int node) {
  Placement placement;
  placement.node = node;
  placement.gpu_count = 1;
  placement.gpu_index[0] = 0;
  return placement;
}

TEST(Engine, FeasibilityChecksCpuMemoryGpusAndModel) {
  Cluster cluster(two_nodes());
  const auto& nodes = cluster.nodes();
  EXPECT_TRUE(cluster.fits(nodes[0], cluster.request_for(pod(32000, 2, 1000))));
  EXPECT_FALSE(cluster.fits(nodes[0], cluster.request_for(pod(32001, 0, 0))));    // CPU
  EXPECT_FALSE(cluster.fits(nodes[0], cluster.request_for(pod(1000, 4, 1000))));  // GPU count
  EXPECT_FALSE(cluster.fits(nodes[0], cluster.request_for(pod(1000, 1, 500, {"V100M32"}))));
  EXPECT_TRUE(cluster.fits(nodes[1], cluster.request_for(pod(1000, 1, 500, {"T4", "V100M32"}))));
  EXPECT_FALSE(
      cluster.fits(nodes[1], cluster.request_for(pod(1000, 1, 500, {"A100"}))));  // none has it
}

TEST(Engine, SharingPodsFillTheTightestGpuAndWholeGpusNeedFreeOnes) {
  Cluster cluster(two_nodes());
  std::mt19937_64 random(1);
  const Request half = cluster.request_for(pod(1000, 1, 500, {"T4"}));
  const Placement first = cluster.place(half, Policy::best_fit, random);
  ASSERT_EQ(first.node, 0);
  cluster.allocate(half, first);
  const Request small = cluster.request_for(pod(1000, 1, 300, {"T4"}));
  const Placement second = cluster.place(small, Policy::best_fit, random);
  ASSERT_EQ(second.node, 0);
  EXPECT_EQ(second.gpu_index[0], first.gpu_index[0]);  // the partly used GPU, not a fresh one
  cluster.allocate(small, second);
  const Request whole = cluster.request_for(pod(1000, 2, 1000, {"T4"}));
  EXPECT_EQ(cluster.place(whole, Policy::best_fit, random).node, -1);  // one T4 is partly used
  EXPECT_EQ(cluster.gpu_milli_allocated(), 800);
  cluster.release(small, second);
  cluster.release(half, first);
  EXPECT_EQ(cluster.gpu_milli_allocated(), 0);
  EXPECT_EQ(cluster.place(whole, Policy::best_fit, random).node, 0);
}

TEST(Engine, PoliciesMakeTheirDefiningChoice) {
  // n0: one GPU half used; n1: idle. A 300-milli sharing pod.
  Cluster cluster({{"n0", 64000, 262144, 2, "G2"}, {"n1", 64000, 262144, 2, "G2"}});
  std::mt19937_64 random(7);
  const Request half = cluster.request_for(pod(1000, 1, 500));
  cluster.allocate(half, on_gpu_0_of(0));
  const Request small = cluster.request_for(pod(1000, 1, 300));
  EXPECT_EQ(cluster.place(small, Policy::gpu_packing, random).node, 0);     // the used GPU
  EXPECT_EQ(cluster.place(small, Policy::best_fit, random).node, 0);        // least left over
  EXPECT_EQ(cluster.place(small, Policy::spread, random).node, 1);          // the emptiest
  EXPECT_EQ(cluster.place(small, Policy::gpu_clustering, random).node, 0);  // same kind there
}

TEST(Engine, AmongEqualsTheFirstNodeWinsExceptUnderRandom) {
  const std::vector<NodeSpec> nodes = {{"n0", 64000, 262144, 2, "G2"},
                                       {"n1", 64000, 262144, 2, "G2"},
                                       {"n2", 64000, 262144, 2, "G2"}};
  std::set<int> chosen_at_random;
  for (std::uint64_t seed = 0; seed < 30; ++seed) {
    Cluster cluster(nodes);
    std::mt19937_64 random(seed);
    const Request request = cluster.request_for(pod(1000, 1, 1000));
    EXPECT_EQ(cluster.place(request, Policy::best_fit, random).node, 0);
    EXPECT_EQ(cluster.place(request, Policy::fgd, random).node, 0);
    chosen_at_random.insert(cluster.place(request, Policy::random, random).node);
  }
  EXPECT_EQ(chosen_at_random.size(), 3u);
}

TEST(Engine, TesserasPolicyBreaksFgdsTiesByPacking) {
  // n0 idle; n1 with half of one GPU taken. Against a CPU-only target workload every idle GPU
  // is a fragment, so FGD rates both nodes alike for any pod.
  Cluster cluster({{"n0", 64000, 262144, 2, "G2"}, {"n1", 64000, 262144, 2, "G2"}});
  cluster.set_target_workload({pod(1000, 0, 0)});
  cluster.allocate(cluster.request_for(pod(1000, 1, 500)), on_gpu_0_of(1));
  std::mt19937_64 random(1);
  const Request sharing = cluster.request_for(pod(1000, 1, 300));
  EXPECT_EQ(cluster.place(sharing, Policy::fgd, random).node, 0);         // the first of equals
  EXPECT_EQ(cluster.place(sharing, Policy::fgd_packed, random).node, 1);  // a partly used GPU
  const Request whole = cluster.request_for(pod(1000, 1, 1000));
  EXPECT_EQ(cluster.place(whole, Policy::fgd_packed, random).node, 0);  // FGD's own order
  const Request cpu_only = cluster.request_for(pod(4000, 0, 0));
  EXPECT_EQ(cluster.place(cpu_only, Policy::fgd, random).node, 0);
  EXPECT_EQ(cluster.place(cpu_only, Policy::fgd_packed, random).node, 1);  // least GPU left
}

TEST(Engine, BalancedPlacementKeepsCpuWhereGpusWillNeedIt) {
  // The workload asks 10 cores per GPU on average, but its one popular class only 4: FGD, which
  // looks one pod of a popular class ahead, sees no difference between the nodes below, while
  // the CPU-poor one is short of CPU for its GPUs at the workload's ratio.
  std::vector<PodSpec> workload(19, pod(4000, 1, 1000));
  workload.push_back(pod(124000, 1, 1000));
  const std::vector<NodeSpec> nodes = {{"rich", 100000, 262144, 2, "T4"},
                                       {"poor", 16000, 262144, 2, "T4"}};
  Cluster cluster(nodes);
  cluster.set_target_workload(workload);
  EXPECT_DOUBLE_EQ(cluster.stranded_gpu(cluster.nodes()[0]), 0);     // 100 cores feed 10 GPUs
  EXPECT_NEAR(cluster.stranded_gpu(cluster.nodes()[1]), 400, 1e-6);  // 16 cores feed 1.6 GPUs
  std::mt19937_64 random(1);
  // A CPU-light GPU pod: to the node that has too little CPU for its GPUs anyway.
  const Request light = cluster.request_for(pod(4000, 1, 1000));
  EXPECT_EQ(cluster.place(light, Policy::fgd, random).node, 0);  // the first of equals
  EXPECT_EQ(cluster.place(light, Policy::fgd_balanced, random).node, 1);
  // A CPU-only pod: to the node with CPU to spare, not the one whose GPUs need its CPU.
  Cluster reversed({nodes[1], nodes[0]});
  reversed.set_target_workload(workload);
  const Request cpu_only = reversed.request_for(pod(8000, 0, 0));
  EXPECT_EQ(reversed.place(cpu_only, Policy::fgd, random).node, 0);
  EXPECT_EQ(reversed.place(cpu_only, Policy::fgd_balanced, random).node, 1);
  // Without GPU pods in the workload there is no ratio to keep: nothing is stranded.
  reversed.set_target_workload({pod(8000, 0, 0)});
  EXPECT_DOUBLE_EQ(reversed.stranded_gpu(reversed.nodes()[0]), 0);
}

TEST(Engine, BalancedPlacementLeavesAModelToThePodsThatNeedIt) {
  // Three fifths of the workload may run only on G2s, a fifth only on T4s; the cluster has 8
  // G2s and 2 T4s. To FGD a free T4 is fragmented for the G2-only pods, so an unrestricted pod
  // that takes it "removes more fragmentation" than one on a G2: FGD sends it to the T4, where
  // the T4-only pods will miss it. fgd-balanced counts a model's GPUs as no fragment for pods
  // that may not use them, and charges a pod that could go elsewhere for the GPUs it takes of
  // a model the restricted pods need: the T4-only pods need all the T4s (a fifth of the GPU
  // asked, a fifth of the GPUs), the G2-only ones three quarters of the G2s.
  std::vector<PodSpec> workload(3, pod(4000, 1, 1000, {"G2"}));
  workload.push_back(pod(4000, 1, 1000, {"T4"}));
  workload.push_back(pod(4000, 1, 1000));
  Cluster cluster({{"g2", 64000, 262144, 8, "G2"}, {"t4", 64000, 262144, 2, "T4"}});
  cluster.set_target_workload(workload);
  std::mt19937_64 random(1);
  const Request any = cluster.request_for(pod(4000, 1, 1000));
  EXPECT_EQ(cluster.place(any, Policy::fgd, random).node, 1);
  EXPECT_EQ(cluster.place(any, Policy::fgd_packed, random).node, 1);
  EXPECT_EQ(cluster.place(any, Policy::fgd_balanced, random).node, 0);
  // The measure FGD and the curves report is the paper's, T4s counted for the G2-only pods.
  EXPECT_NEAR(cluster.fragmentation(cluster.nodes()[1]), 0.6 * 2000, 1e-6);
  // A pod restricted to T4s goes to them, uncharged.
  const Request t4_only = cluster.request_for(pod(4000, 1, 1000, {"T4"}));
  EXPECT_EQ(cluster.place(t4_only, Policy::fgd_balanced, random).node, 1);
  // Without restricted pods in the workload no model is reserved: the first of equals.
  Cluster reversed({{"t4", 64000, 262144, 2, "T4"}, {"g2", 64000, 262144, 8, "G2"}});
  reversed.set_target_workload({pod(4000, 1, 1000)});
  EXPECT_EQ(reversed.place(any, Policy::fgd_balanced, random).node, 0);
  reversed.set_target_workload(workload);
  EXPECT_EQ(reversed.place(any, Policy::fgd_balanced, random).node, 1);
}

TEST(Engine, FragmentationCountsGpusTooSmallForTheWorkload) {
  Cluster cluster({{"n0", 64000, 262144, 2, "G2"}});
  // The target workload: only 600-milli sharing pods.
  cluster.set_target_workload({pod(1000, 1, 600), pod(1000, 1, 600)});
  EXPECT_DOUBLE_EQ(cluster.fragmentation(), 0);  // both GPUs can take one
  cluster.allocate(cluster.request_for(pod(1000, 1, 500)), on_gpu_0_of(0));
  EXPECT_DOUBLE_EQ(cluster.fragmentation(), 500);  // GPU 0's 500 left fits no 600 pod
  // FGD puts a 400 pod where it removes fragmentation: on GPU 0.
  std::mt19937_64 random(3);
  const Placement fgd = cluster.place(cluster.request_for(pod(1000, 1, 400)), Policy::fgd, random);
  EXPECT_EQ(fgd.gpu_index[0], 0);
}

// A node of `gpus` shared A100s and MIG devices (profile, count, milli each).
NodeSpec mig_node(const std::string& name, std::int64_t cpu, int gpus,
                  std::vector<MigDevices> mig) {
  NodeSpec spec{name, cpu, 1 << 20, gpus, "A100"};
  spec.mig = std::move(mig);
  return spec;
}

PodSpec mig_pod(std::int64_t cpu, std::vector<std::pair<std::string, int>> mig) {
  PodSpec spec = pod(cpu, 0, 0);
  spec.mig = std::move(mig);
  return spec;
}

TEST(Engine, MigDevicesFitByProfileAndComeBack) {
  Cluster cluster({mig_node("n0", 64000, 1, {{"1g.10gb", 2, 143}, {"3g.40gb", 1, 429}}),
                   {"n1", 64000, 1 << 20, 2, "A100"}});
  EXPECT_EQ(cluster.gpu_milli_total(), 1000 + 2 * 143 + 429 + 2000);
  const auto& n0 = cluster.nodes()[0];
  EXPECT_EQ(n0.gpu_milli_left(), 1000 + 2 * 143 + 429);
  const Request two_small = cluster.request_for(mig_pod(1000, {{"1g.10gb", 2}}));
  EXPECT_EQ(two_small.kind, 6);
  EXPECT_TRUE(cluster.fits(n0, two_small));
  EXPECT_FALSE(cluster.fits(cluster.nodes()[1], two_small));  // no MIG devices there
  EXPECT_FALSE(cluster.fits(n0, cluster.request_for(mig_pod(1000, {{"1g.10gb", 3}}))));
  EXPECT_FALSE(cluster.fits(n0, cluster.request_for(mig_pod(1000, {{"7g.80gb", 1}}))));
  EXPECT_FALSE(cluster.fits(n0, cluster.request_for(mig_pod(100000, {{"1g.10gb", 1}}))));
  // Asked together with a shared GPU, both must fit; a zero count asks nothing.
  PodSpec both = mig_pod(1000, {{"3g.40gb", 1}, {"1g.10gb", 0}});
  both.gpus = 1;
  both.gpu_milli = 500;
  const Request mixed = cluster.request_for(both);
  EXPECT_EQ(mixed.mig_asks, 1);
  EXPECT_TRUE(cluster.fits(n0, mixed));
  // More profiles than a pod may ask for fits nowhere, rather than some of them.
  std::vector<std::pair<std::string, int>> many;
  for (int k = 0; k <= kMostMigAsks; ++k) many.emplace_back("1g.10gb", 1);
  EXPECT_FALSE(cluster.fits(n0, cluster.request_for(mig_pod(1000, many))));

  std::mt19937_64 random(5);
  const Placement placed = cluster.place(two_small, Policy::fgd_balanced, random);
  ASSERT_EQ(placed.node, 0);
  EXPECT_EQ(placed.gpu_count, 0);  // the kubelet picks the devices
  cluster.allocate(two_small, placed);
  EXPECT_EQ(cluster.mig_free(0, "1g.10gb"), 0);
  EXPECT_EQ(cluster.mig_free(0, "3g.40gb"), 1);
  EXPECT_EQ(cluster.mig_free(1, "1g.10gb"), 0);
  EXPECT_EQ(cluster.mig_free(0, "unheard-of"), 0);
  EXPECT_EQ(cluster.gpu_milli_allocated(), 2 * 143);
  EXPECT_EQ(cluster.place(two_small, Policy::fgd_balanced, random).node, -1);
  // A hold beyond the devices (a pod placed by someone else) counts below zero.
  cluster.allocate(two_small, placed);
  EXPECT_EQ(cluster.mig_free(0, "1g.10gb"), -2);
  EXPECT_EQ(cluster.nodes()[0].gpu_milli_left(), 1000 + 429);
  cluster.release(two_small, placed);
  cluster.release(two_small, placed);
  EXPECT_EQ(cluster.mig_free(0, "1g.10gb"), 2);
  EXPECT_EQ(cluster.gpu_milli_allocated(), 0);
}

TEST(Engine, ANodeWithMoreMigProfilesThanTheEngineHoldsIsRefused) {
  std::vector<MigDevices> devices;
  for (int k = 0; k <= kMostMigProfilesPerNode; ++k)
    devices.push_back({"1g." + std::to_string(k) + "gb", 1, 143});
  try {
    Cluster cluster({mig_node("crowded", 64000, 0, devices)});
    FAIL() << "accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("node crowded: more than 8 MIG profiles"),
              std::string::npos)
        << error.what();
  }
}

TEST(Engine, FragmentationCountsMigDevicesAsForSharedGpus) {
  Cluster cluster({mig_node("n0", 64000, 1, {{"1g.10gb", 2, 143}, {"3g.40gb", 1, 429}})});
  cluster.allocate(cluster.request_for(pod(1000, 1, 400)), on_gpu_0_of(0));  // 600 left
  // Half 500-milli sharing pods, a quarter 1g pods, a quarter pods of two 3g devices.
  std::vector<PodSpec> workload(2, pod(1000, 1, 500));
  workload.push_back(mig_pod(1000, {{"1g.10gb", 1}}));
  workload.push_back(mig_pod(1000, {{"3g.40gb", 2}}));
  cluster.set_target_workload(workload, 1.0);
  // Free: 600 + 2 x 143 + 429 = 1315. A sharing pod can use the 600, a 1g pod the 286, and
  // the 3g pod nothing here: 0.5 x 715 + 0.25 x 1029 + 0.25 x 1315.
  EXPECT_DOUBLE_EQ(cluster.fragmentation(), 0.5 * 715 + 0.25 * 1029 + 0.25 * 1315);
  // A node whose CPU is gone fits no class: everything free is a fragment.
  cluster.allocate(cluster.request_for(pod(63500, 0, 0)), Placement{0, 0, {}});
  EXPECT_DOUBLE_EQ(cluster.fragmentation(), 1315);
}

TEST(Engine, CpuHeavySharingPodsStayOffTheNodeWhoseMigDevicesNeedItsCpu) {
  // Two nodes alike but for MIG devices: "mig" also has two 3g devices, which the workload's
  // 3g pods (4 cores each) need its CPU for.
  const std::vector<NodeSpec> nodes = {mig_node("mig", 8000, 1, {{"3g.40gb", 2, 429}}),
                                       {"plain", 8000, 1 << 20, 1, "A100"}};
  std::vector<PodSpec> workload = {pod(2000, 1, 500), mig_pod(4000, {{"3g.40gb", 1}})};
  const Request heavy_share = Cluster(nodes).request_for(pod(6000, 1, 500));
  std::mt19937_64 random(7);
  for (Policy policy : {Policy::fgd, Policy::fgd_packed, Policy::fgd_balanced}) {
    Cluster cluster(nodes);
    cluster.set_target_workload(workload, 1.0);
    // On "mig" it would leave 2 cores: the MIG devices could take no 3g pod.
    EXPECT_EQ(cluster.place(heavy_share, policy, random).node, 1) << policy_name(policy);
    // Blind to MIG devices, the nodes are equal and the first wins.
    Cluster blind({{"mig", 8000, 1 << 20, 1, "A100"}, nodes[1]});
    blind.set_target_workload(workload, 1.0);
    EXPECT_EQ(blind.place(heavy_share, policy, random).node, 0) << policy_name(policy);
  }
}

// Random arrivals and departures of sharing, whole-GPU, CPU-only and MIG pods on a mixed
// cluster: the cached scores must choose as scores measured afresh do, and the devices held
// must be what the pods placed hold.
TEST(Engine, MixedPlacementKeepsItsBooksAndChoosesAsAFreshLookWould) {
  std::vector<NodeSpec> nodes;
  for (int n = 0; n < 12; ++n) {
    std::vector<MigDevices> mig;
    if (n % 3 != 0) mig.push_back({"1g.10gb", 1 + n % 4, 143});
    if (n % 4 != 0) mig.push_back({"3g.40gb", 1 + n % 2, 429});
    nodes.push_back(mig_node("n" + std::to_string(n), 16000 + 8000 * (n % 5), n % 3, mig));
  }
  std::mt19937_64 random(11);
  const std::vector<PodSpec> kinds = {pod(2000, 1, 300),
                                      pod(6000, 1, 700),
                                      pod(8000, 1, 1000),
                                      pod(4000, 0, 0),
                                      mig_pod(2000, {{"1g.10gb", 1}}),
                                      mig_pod(2000, {{"3g.40gb", 1}}),
                                      mig_pod(6000, {{"3g.40gb", 1}}),
                                      mig_pod(3000, {{"1g.10gb", 2}, {"3g.40gb", 1}})};
  for (Policy policy : {Policy::fgd, Policy::fgd_packed, Policy::fgd_balanced, Policy::best_fit,
                        Policy::gpu_packing}) {
    Cluster cluster(nodes);
    cluster.set_target_workload(kinds, 1.0);
    std::vector<std::pair<Request, Placement>> running;
    for (int step = 0; step < 400; ++step) {
      if (!running.empty() && random() % 3 == 0) {  // a departure
        const std::size_t which = random() % running.size();
        cluster.release(running[which].first, running[which].second);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(which));
        continue;
      }
      const Request request = cluster.request_for(kinds[random() % kinds.size()]);
      double best = -1e300;
      for (int n = 0; n < static_cast<int>(nodes.size()); ++n) {
        double value = 0;
        if (cluster.score_on(n, request, policy, value)) best = std::max(best, value);
      }
      const Placement placed = cluster.place(request, policy, random);
      if (placed.node < 0) {
        ASSERT_EQ(best, -1e300) << "a node fits, yet none was chosen";
        continue;
      }
      double chosen = 0;
      ASSERT_TRUE(cluster.score_on(placed.node, request, policy, chosen));
      ASSERT_NEAR(chosen, best, 1e-9) << policy_name(policy) << " step " << step;
      cluster.allocate(request, placed);
      running.emplace_back(request, placed);
    }
    // The books: each node's free devices are its devices less those the running pods hold.
    std::int64_t allocated = 0;
    for (int n = 0; n < static_cast<int>(nodes.size()); ++n) {
      for (const MigDevices& devices : nodes[n].mig) {
        const std::uint8_t profile =
            cluster.request_for(mig_pod(0, {{devices.profile, 1}})).mig[0].profile;
        int held = 0;
        for (const auto& [request, placement] : running) {
          for (int k = 0; k < request.mig_asks; ++k) {
            if (placement.node == n && request.mig[k].profile == profile)
              held += request.mig[k].count;
          }
        }
        EXPECT_EQ(cluster.mig_free(n, devices.profile), devices.count - held);
        EXPECT_GE(cluster.mig_free(n, devices.profile), 0);
        allocated += std::int64_t{held} * devices.milli;
      }
    }
    for (const auto& [request, placement] : running)
      allocated += std::int64_t{request.gpus} * request.gpu_milli;
    EXPECT_EQ(cluster.gpu_milli_allocated(), allocated) << policy_name(policy);
  }
}

// Occupants of node 0 of a one-node cluster, each allocated there as given.
struct Occupied {
  Cluster cluster;
  std::vector<Occupant> occupants;
  void add(const PodSpec& spec, std::int32_t priority, std::vector<int> gpus) {
    Occupant occupant{cluster.request_for(spec), {}, priority};
    occupant.placement.node = 0;
    for (int gpu : gpus) occupant.placement.gpu_index[occupant.placement.gpu_count++] = gpu;
    cluster.allocate(occupant.request, occupant.placement);
    occupants.push_back(occupant);
  }
  std::optional<std::vector<std::size_t>> victims(const PodSpec& spec, std::int32_t priority) {
    return cluster.preemption_victims(0, cluster.request_for(spec), priority, occupants);
  }
};

TEST(Engine, PreemptionFreesOneGpuWithTheFewestVictims) {
  // GPU 0 runs A (500 milli, priority 1); GPU 1 runs B and C (300 each, priority 0). Nothing
  // fits 800 milli. By priority alone, as kube-scheduler's node-level view picks, B and C go
  // first, and a 500 is still in the way on each GPU; freeing GPU 0 takes one victim.
  Occupied node{Cluster({{"n", 64000, 262144, 2, "T4"}}), {}};
  node.add(pod(4000, 1, 500), 1, {0});
  node.add(pod(4000, 1, 300), 0, {1});
  node.add(pod(4000, 1, 300), 0, {1});
  EXPECT_EQ(node.victims(pod(4000, 1, 800), 10), std::vector<std::size_t>{0});
  // A whole GPU, the same.
  EXPECT_EQ(node.victims(pod(4000, 1, 1000), 10), std::vector<std::size_t>{0});
  // 600 milli fits beside one 300 on GPU 1: one victim of priority 0 beats one of priority 1.
  const auto beside = node.victims(pod(4000, 1, 600), 10);
  ASSERT_TRUE(beside.has_value());
  ASSERT_EQ(beside->size(), 1u);
  EXPECT_EQ(node.occupants[beside->front()].priority, 0);
  // Two whole GPUs: everything goes.
  EXPECT_EQ(node.victims(pod(4000, 2, 1000), 10), (std::vector<std::size_t>{0, 1, 2}));
  // Room as it is: nobody.
  EXPECT_EQ(node.victims(pod(4000, 1, 200), 10), std::vector<std::size_t>{});
}

TEST(Engine, PreemptionNeverTakesPodsOfEqualOrHigherPriority) {
  Occupied node{Cluster({{"n", 64000, 262144, 2, "T4"}}), {}};
  node.add(pod(4000, 1, 500), 5, {0});
  node.add(pod(4000, 1, 300), 0, {1});
  node.add(pod(4000, 1, 300), 0, {1});
  // A at 5 is not below 5: GPU 1's two go.
  EXPECT_EQ(node.victims(pod(4000, 1, 800), 5), (std::vector<std::size_t>{1, 2}));
  // Below both: nothing can make room.
  EXPECT_EQ(node.victims(pod(4000, 1, 800), 0), std::nullopt);
  // C made high: GPU 1 cannot be freed, and A is not below 5.
  node.occupants[2].priority = 7;
  EXPECT_EQ(node.victims(pod(4000, 1, 800), 5), std::nullopt);
}

TEST(Engine, PreemptionFreesCpuAndMigDevicesToo) {
  NodeSpec spec{"n", 16000, 262144, 1, "A100"};
  spec.mig = {{"1g.10gb", 2, 142}};
  Occupied node{Cluster({spec}), {}};
  node.add(pod(12000, 0, 0), 0, {});  // a CPU-only pod holding most of the CPU
  PodSpec mig_pod = pod(1000, 0, 0);
  mig_pod.mig = {{"1g.10gb", 1}};
  node.add(mig_pod, 0, {});
  node.add(mig_pod, 3, {});
  node.add(pod(1000, 1, 1000), 0, {0});
  // 8 cores and a whole GPU: the CPU-only pod and the GPU's pod.
  EXPECT_EQ(node.victims(pod(8000, 1, 1000), 10), (std::vector<std::size_t>{0, 3}));
  // A MIG device: the lower of its two holders.
  EXPECT_EQ(node.victims(mig_pod, 10), std::vector<std::size_t>{1});
  // Occupants of other nodes are never victims here.
  node.occupants[3].placement.node = 1;
  EXPECT_EQ(node.victims(pod(1000, 1, 1000), 10), std::nullopt);
}

TEST(Engine, UnknownPoliciesAreNamed) {
  try {
    parse_policy("tetris");
    FAIL() << "accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("unknown policy 'tetris' (known: random, best-fit"),
              std::string::npos);
  }
}

// Writes `text` as `name` and expects `read` to refuse it with `expected` after the path.
template <typename Read>
void expect_refused(const ScratchDirectory& scratch, const char* name, const char* text,
                    const char* expected, Read read) {
  const std::string path = write(scratch, name, text);
  try {
    read(path);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(path + expected), std::string::npos) << error.what();
  }
}

TEST(Trace, MalformedFilesAreRefusedWithFileLineAndColumn) {
  ScratchDirectory scratch;
  struct Case {
    const char* text;
    const char* expected;
  } nodes[] = {
      {"sn,cpu,memory_mib,gpu,model\n", ":1:2: expected column 'cpu_milli', found 'cpu'"},
      {"sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,2\n", ":2: 4 fields, the header has 5"},
      {"sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,x,T4\n",
       ":2:4: 'x' is not a whole number"},
      {"sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,2,\n",
       ":2:5: a node with GPUs needs a model"},
      {"sn,cpu_milli,memory_mib,gpu,model\n", ": no nodes"},
  };
  for (const Case& c : nodes) expect_refused(scratch, "nodes.csv", c.text, c.expected, read_nodes);
  const Case pods[] = {
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,2,500\n",
       ":2:5: a pod with 2 GPUs must ask for 1000 milli-GPU each, not 500"},
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,1,1001\n",
       ":2:5: '1001' is not a whole number from 0 to 1000"},
      {"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,-5,10,1,100\n", ":2:2: '-5' is not"},
  };
  for (const Case& c : pods) expect_refused(scratch, "pods.csv", c.text, c.expected, read_pods);
}

TEST(Experiment, TheSameSeedGivesTheSameCurveAndTheLoadIsReached) {
  ScratchDirectory scratch;
  const auto nodes =
      node_list(scratch, "a,64000,262144,8,G2\nb,64000,262144,8,G2\nc,32000,131072,2,T4\n");
  const auto pods = pod_list(scratch, "pods.csv",
                             "p0,4000,8192,1,500,\np1,8000,16384,1,1000,\np2,2000,4096,0,0,\n"
                             "p3,16000,32768,2,1000,G2\np4,4000,8192,1,250,T4\n");
  for (Policy policy : all_policies()) {
    const RunResult first = run_inflation(nodes, pods, policy, 42, 1.3);
    const RunResult again = run_inflation(nodes, pods, policy, 42, 1.3);
    ASSERT_EQ(first.curve.size(), again.curve.size());
    for (std::size_t i = 0; i < first.curve.size(); ++i) {
      EXPECT_EQ(first.curve[i].allocated, again.curve[i].allocated) << policy_name(policy);
    }
    EXPECT_GE(first.curve.back().arrived, 1.3);
    EXPECT_LE(first.allocated_at(1.3), 1.0);
    EXPECT_GT(first.placed, 0);
  }
}

TEST(Experiment, TheOpenbTraceReproducesThePapersBaselines) {
  const std::string data = std::string(TESSERA_SOURCE_DIR) + "/data/openb/";
  const auto nodes = read_nodes(data + "openb_node_list_gpu_node.csv");
  const auto pods = read_pods(data + "openb_pod_list_default.csv");
  ASSERT_EQ(nodes.size(), 1213u);
  double best_fit = 0, dot_product = 0, packing = 0, random = 0;
  for (std::uint64_t seed = 42; seed < 45; ++seed) {
    auto at_130 = [&](Policy policy) {
      return 100 * run_inflation(nodes, pods, policy, seed, 1.3).allocated_at(1.3) / 3;
    };
    best_fit += at_130(Policy::best_fit);
    dot_product += at_130(Policy::dot_product);
    packing += at_130(Policy::gpu_packing);
    random += at_130(Policy::random);
  }
  // The paper at 130 % arrived (mean of 10 seeds): BestFit 93.08 %, DotProd 90.85 %,
  // GpuPacking 92.00 %, Random 87.47 %.
  EXPECT_NEAR(best_fit, 93.08, 0.5);
  EXPECT_NEAR(dot_product, 90.85, 0.5);
  EXPECT_NEAR(packing, 92.00, 0.5);
  EXPECT_NEAR(random, 87.47, 0.5);
}

TEST(Experiment, FgdMatchesThePaperAndTesserasPolicyBeatsIt) {
  const std::string data = std::string(TESSERA_SOURCE_DIR) + "/data/openb/";
  const auto nodes = read_nodes(data + "openb_node_list_gpu_node.csv");
  const auto pods = read_pods(data + "openb_pod_list_default.csv");
  double fgd[2] = {}, packed[2] = {};  // at 100 % and 130 % arrived, mean of the paper's seeds
  for (std::uint64_t seed = 42; seed <= 51; ++seed) {
    const RunResult by_fgd = run_inflation(nodes, pods, Policy::fgd, seed, 1.3);
    const RunResult by_packed = run_inflation(nodes, pods, Policy::fgd_packed, seed, 1.3);
    for (int i = 0; i < 2; ++i) {
      fgd[i] += 100 * by_fgd.allocated_at(i == 0 ? 1.0 : 1.3) / 10;
      packed[i] += 100 * by_packed.allocated_at(i == 0 ? 1.0 : 1.3) / 10;
    }
  }
  EXPECT_NEAR(fgd[0], 95.23, 0.3);  // the paper's FGD (measured: 95.24)
  EXPECT_NEAR(fgd[1], 95.39, 0.3);  // (measured: 95.40)
  EXPECT_GT(packed[0], fgd[0]);     // measured: +0.05
  EXPECT_GT(packed[1], fgd[1]);     // measured: +0.06
}

// Mean allocation (%) of a policy at 100 % and 130 % arrived over seeds 42-44: fewer than the
// table's 10, to stay quick.
std::array<double, 2> allocation(const std::vector<NodeSpec>& nodes,
                                 const std::vector<PodSpec>& pods, Policy policy) {
  std::array<double, 2> mean = {};
  for (std::uint64_t seed = 42; seed < 45; ++seed) {
    const RunResult run = run_inflation(nodes, pods, policy, seed, 1.3);
    mean[0] += 100 * run.allocated_at(1.0) / 3;
    mean[1] += 100 * run.allocated_at(1.3) / 3;
  }
  return mean;
}

// On every openb trace fgd-balanced allocates more than FGD at both loads. Measured over seeds
// 42-51: +0.16 to +0.80 points at 100 %, +0.37 to +0.91 at 130 %.
TEST(Experiment, BalancedPlacementBeatsFgdOnEveryTrace) {
  const std::string data = std::string(TESSERA_SOURCE_DIR) + "/data/openb/";
  const auto nodes = read_nodes(data + "openb_node_list_gpu_node.csv");
  for (const char* trace :
       {"default", "cpu050", "gpushare40", "gpushare80", "gpuspec10", "multigpu30"}) {
    const auto pods = read_pods(data + "openb_pod_list_" + trace + ".csv");
    const auto fgd = allocation(nodes, pods, Policy::fgd);
    const auto balanced = allocation(nodes, pods, Policy::fgd_balanced);
    EXPECT_GT(balanced[0], fgd[0] + 0.1) << trace;
    EXPECT_GT(balanced[1], fgd[1] + 0.25) << trace;
  }
}

// The shapes that the default used to lose on: a third of the pods asking for one GPU model
// (chosen by the models' GPUs, or each model alike), and CPU-only pods twice as many beside
// CPU-heavier GPU pods. Generated with a seed the tuning (bench/generated_table.sh) did not use.
TEST(Experiment, BalancedPlacementHoldsAgainstFgdOnGeneratedTraces) {
  const std::string data = std::string(TESSERA_SOURCE_DIR) + "/data/openb/";
  const auto nodes = read_nodes(data + "openb_node_list_gpu_node.csv");
  const auto source = read_pods(data + "openb_pod_list_default.csv");
  TraceShape model_bound;
  model_bound.gpu_spec = 1.0 / 3;
  TraceShape rare_models_bound = model_bound;  // as many restricted to A10 (2 GPUs) as to G2
  rare_models_bound.model_choice = TraceShape::ModelChoice::uniform;
  TraceShape cpu_bound;
  cpu_bound.cpu_only = 2;
  cpu_bound.gpu_pod_cpu = 1.1;
  for (const TraceShape& shape : {model_bound, rare_models_bound, cpu_bound}) {
    const auto pods = generate_trace(source, nodes, shape, 2026);
    const auto fgd = allocation(nodes, pods, Policy::fgd);
    const auto balanced = allocation(nodes, pods, Policy::fgd_balanced);
    std::printf("fgd %.2f / %.2f, fgd-balanced %.2f / %.2f\n", fgd[0], fgd[1], balanced[0],
                balanced[1]);
    EXPECT_GT(balanced[0], fgd[0]) << shape.gpu_spec;
    EXPECT_GT(balanced[1], fgd[1]) << shape.gpu_spec;
  }
}

TEST(Experiment, PreemptionLetsHigherQosPodsEvictLowerOnes) {
  const std::string data = std::string(TESSERA_SOURCE_DIR) + "/data/openb/";
  const auto nodes = read_nodes(data + "openb_node_list_gpu_node.csv");
  auto pods = read_pods(data + "openb_pod_list_default.csv");
  EXPECT_EQ(priority_of_qos("LS"), 1000);
  EXPECT_EQ(priority_of_qos("Guaranteed"), 1000);
  EXPECT_EQ(priority_of_qos("Burstable"), 500);
  EXPECT_EQ(priority_of_qos("BE"), 0);
  EXPECT_EQ(priority_of_qos(""), 0);
  const RunResult without = run_inflation(nodes, pods, Policy::fgd_balanced, 42, 1.3);
  const RunResult with =
      run_inflation(nodes, pods, Policy::fgd_balanced, 42, 1.3, Workload::trace_then_sample, true);
  EXPECT_EQ(without.preemptions, 0);
  EXPECT_EQ(with.placed + with.pending, without.placed + without.pending);  // the same arrivals
  EXPECT_GT(with.preemptions, 0);
  EXPECT_GE(with.victims, with.preemptions);  // each preemption evicts someone
  // The same seed, the same run.
  const RunResult again =
      run_inflation(nodes, pods, Policy::fgd_balanced, 42, 1.3, Workload::trace_then_sample, true);
  EXPECT_EQ(again.victims, with.victims);
  // All of one priority: nobody may evict anybody.
  for (PodSpec& pod : pods) pod.qos = "BE";
  const RunResult equals =
      run_inflation(nodes, pods, Policy::fgd_balanced, 42, 1.3, Workload::trace_then_sample, true);
  EXPECT_EQ(equals.preemptions, 0);
  EXPECT_EQ(equals.placed, without.placed);
}

TEST(Experiment, TheOfflinePackerFillsGpusWithSizesThatAddUpWhereArrivalOrderCannot) {
  ScratchDirectory scratch;
  // One node of 4 GPUs; pods of 600 and 400 milli, arriving to 200 % of the GPUs.
  const auto nodes = node_list(scratch, "a,64000,262144,4,T4\n");
  const auto pods = pod_list(scratch, "pods.csv", "p0,1000,1024,1,600,\np1,1000,1024,1,400,\n");
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    const RunResult packer = run_reference(nodes, pods, Reference::offline_packer, seed, 2.0);
    const RunResult bound = run_reference(nodes, pods, Reference::bound, seed, 2.0);
    EXPECT_EQ(packer.name, "offline-packer");
    EXPECT_DOUBLE_EQ(packer.allocated_at(2.0), 1.0) << "seed " << seed;
    EXPECT_DOUBLE_EQ(bound.allocated_at(2.0), 1.0);
  }
  // CPU bounds what any schedule allocates: 4 GPUs of pods asking 40 cores each, on 64.
  const auto hungry = pod_list(scratch, "hungry.csv", "p0,40000,1024,1,1000,\n");
  EXPECT_DOUBLE_EQ(run_reference(nodes, hungry, Reference::bound, 1, 1.3).allocated_at(1.3),
                   64.0 / 40 / 4);
  EXPECT_DOUBLE_EQ(
      run_reference(nodes, hungry, Reference::offline_packer, 1, 1.3).allocated_at(1.3), 0.25);
}

TEST(Experiment, TheOfflinePackerLeavesEachGpuItsShareOfTheNodesMemory) {
  ScratchDirectory scratch;
  // One node of 2 GPUs and 48 GiB. A whole-GPU pod asking 40 GiB and more CPU, two asking
  // 10 GiB: packing the CPU-hungriest first would strand the second GPU for want of memory.
  const auto nodes = node_list(scratch, "a,64000,49152,2,T4\n");
  const auto pods = pod_list(scratch, "pods.csv",
                             "big,4000,40960,1,1000,\nsmall,2000,10240,1,1000,\n"
                             "small2,2000,10240,1,1000,\n");
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    const RunResult packer = run_reference(nodes, pods, Reference::offline_packer, seed, 1.3);
    EXPECT_DOUBLE_EQ(packer.allocated_at(1.3), 1.0) << "seed " << seed;
  }
}

TEST(Experiment, NoPolicyNorTheOfflinePackerAllocatesMoreThanTheBound) {
  const std::string data = std::string(TESSERA_SOURCE_DIR) + "/data/openb/";
  const auto nodes = read_nodes(data + "openb_node_list_gpu_node.csv");
  for (const char* trace : {"openb_pod_list_default.csv", "openb_pod_list_multigpu30.csv"}) {
    const auto pods = read_pods(data + trace);
    for (const double load : {1.0, 1.3}) {
      const double bound = run_reference(nodes, pods, Reference::bound, 42, 1.3).allocated_at(load);
      const double packer =
          run_reference(nodes, pods, Reference::offline_packer, 42, 1.3).allocated_at(load);
      EXPECT_LE(packer, bound + 1e-12) << trace << " at " << load;
      EXPECT_GT(packer, 0.9) << trace << " at " << load;
      for (const Policy policy : {Policy::fgd, Policy::fgd_packed, Policy::best_fit}) {
        EXPECT_LE(run_inflation(nodes, pods, policy, 42, 1.3).allocated_at(load), bound + 1e-12)
            << policy_name(policy) << " on " << trace << " at " << load;
      }
    }
  }
}

}  // namespace
}  // namespace tessera::sched
