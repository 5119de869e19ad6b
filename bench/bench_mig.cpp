// How long tessera mig's planning takes per GPU, against the brute force that enumerates every
// layout the model allows (the baseline, in the same run): placing a layout, the refusal of
// one that cannot fit (with the nearest layouts that can), reconciling a GPU's instances with
// a new layout, and advising on a workload mix. Medians of repetitions:
//   build/bench/bench_mig --benchmark_repetitions=7 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include "mig/advisor.h"
#include "mig/catalog.h"
#include "mig/planner.h"

namespace {

using namespace tessera::mig;

const GpuModel& h100() {
  return *find_model("H100-80GB");
}

// The baseline: every layout of the model, by exhaustive search.
void EveryLayoutBruteForce(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(every_layout(h100()));
}
BENCHMARK(EveryLayoutBruteForce)->Unit(benchmark::kMicrosecond);

void PlaceSevenInstances(benchmark::State& state) {
  const ProfileCounts wanted{{"1g.10gb", 2}, {"1g.20gb", 1}, {"2g.20gb", 1}, {"1g.10gb+me", 1}};
  for (auto _ : state) benchmark::DoNotOptimize(place(h100(), wanted));
}
BENCHMARK(PlaceSevenInstances)->Unit(benchmark::kMicrosecond);

void PlaceThreeGAndTwoTwoG(benchmark::State& state) {
  const ProfileCounts wanted{{"3g.40gb", 1}, {"2g.20gb", 2}};
  for (auto _ : state) benchmark::DoNotOptimize(place(h100(), wanted));
}
BENCHMARK(PlaceThreeGAndTwoTwoG)->Unit(benchmark::kMicrosecond);

// Ten memory slices asked of eight: refused, and the nearest layouts that fit found.
void RefuseWithNearest(benchmark::State& state) {
  const ProfileCounts wanted{{"2g.20gb", 3}, {"1g.20gb", 2}};
  for (auto _ : state) benchmark::DoNotOptimize(place(h100(), wanted));
}
BENCHMARK(RefuseWithNearest)->Unit(benchmark::kMicrosecond);

void ReconcileSevenToMixed(benchmark::State& state) {
  const Profile* one = h100().profile_named("1g.10gb");
  std::vector<Existing> current;
  for (int start = 0; start < 7; ++start) {
    current.push_back({{one, start}, static_cast<unsigned>(start + 1), start < 2});
  }
  const ProfileCounts wanted{{"1g.10gb", 2}, {"2g.20gb", 1}, {"3g.40gb", 1}};
  for (auto _ : state) benchmark::DoNotOptimize(reconcile(h100(), current, wanted, false));
}
BENCHMARK(ReconcileSevenToMixed)->Unit(benchmark::kMicrosecond);

void AdviseTwentyJobsOnFourGpus(benchmark::State& state) {
  std::vector<Job> jobs;
  for (int i = 0; i < 12; ++i) jobs.push_back({"small", 9 * 1024, 1});
  for (int i = 0; i < 6; ++i) jobs.push_back({"medium", 19 * 1024, 2});
  for (int i = 0; i < 2; ++i) jobs.push_back({"large", 39 * 1024, 3});
  for (auto _ : state) benchmark::DoNotOptimize(advise(h100(), jobs, 4));
}
BENCHMARK(AdviseTwentyJobsOnFourGpus)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
