// Placement decisions per second on the openb cluster (1,213 nodes, 6,212 GPUs) at 50 % and
// 95 % GPU allocation, per policy. Target: at least 20,000 decisions per second on one core.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>

#include "sched/engine.h"
#include "sched/trace.h"

namespace {

using namespace tessera::sched;

const std::string kData = std::string(TESSERA_SOURCE_DIR) + "/data/openb/";

struct Fixture {
  std::vector<NodeSpec> nodes = read_nodes(kData + "openb_node_list_gpu_node.csv");
  std::vector<PodSpec> pods = read_pods(kData + "openb_pod_list_default.csv");
};

Fixture& fixture() {
  static Fixture data;
  return data;
}

// A cluster filled with FGD to `load` of its GPUs.
Cluster filled(double load) {
  Cluster cluster(fixture().nodes);
  cluster.set_target_workload(fixture().pods);
  std::mt19937_64 random(1);
  std::uniform_int_distribution<std::size_t> pick(0, fixture().pods.size() - 1);
  int misses = 0;
  while (cluster.gpu_milli_allocated() < load * cluster.gpu_milli_total() && misses < 1000) {
    const Request request = cluster.request_for(fixture().pods[pick(random)]);
    const Placement placement = cluster.place(request, Policy::fgd, random);
    if (placement.node < 0) {
      ++misses;
      continue;
    }
    cluster.allocate(request, placement);
  }
  return cluster;
}

// Decisions for sampled pods on the cluster filled to the benchmark's load under its policy.
// `apply` false: decided only, so the load stays put and cached scores serve. True: as a
// scheduler meets them, each decision applied and taken back, so the chosen node changes
// twice and its cached scores must be measured again.
void Decisions(benchmark::State& state, bool apply) {
  const auto policy = static_cast<Policy>(state.range(0));
  Cluster cluster = filled(state.range(1) / 100.0);
  std::mt19937_64 random(2);
  std::uniform_int_distribution<std::size_t> pick(0, fixture().pods.size() - 1);
  std::vector<Request> requests;
  for (int i = 0; i < 4096; ++i)
    requests.push_back(cluster.request_for(fixture().pods[pick(random)]));
  std::size_t next = 0;
  for (auto _ : state) {
    const Request& request = requests[next++ % requests.size()];
    const Placement placement = cluster.place(request, policy, random);
    benchmark::DoNotOptimize(placement);
    if (apply && placement.node >= 0) {
      cluster.allocate(request, placement);
      cluster.release(request, placement);
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(policy_name(policy) + " at " + std::to_string(state.range(1)) + "% load");
}

void Decide(benchmark::State& state) {
  Decisions(state, false);
}
void DecideAndApply(benchmark::State& state) {
  Decisions(state, true);
}

const std::vector<std::vector<std::int64_t>> kPoliciesAndLoads = {
    {static_cast<long>(Policy::best_fit), static_cast<long>(Policy::fgd),
     static_cast<long>(Policy::fgd_packed), static_cast<long>(Policy::fgd_balanced)},
    {50, 95}};
BENCHMARK(Decide)->ArgsProduct(kPoliciesAndLoads);
BENCHMARK(DecideAndApply)->ArgsProduct(kPoliciesAndLoads);

}  // namespace

BENCHMARK_MAIN();
