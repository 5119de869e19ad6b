// The trace generator: each kind's share of the GPU asked, model restrictions that some node can
// hold, CPU factors within the cluster, determinism by seed, refusals, and the CSV round trip.
#include "sched/trace_generator.h"

#include <fmt/core.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "sched/trace.h"
#include "support.h"

namespace tessera::sched {
namespace {

const std::string kData = std::string(TESSERA_SOURCE_DIR) + "/data/openb/";

struct Shares {
  double sharing = 0, multi = 0, total = 0;
  long cpu_only = 0, gpu_pods = 0, restricted = 0;
};

Shares measure(const std::vector<PodSpec>& pods) {
  Shares shares;
  for (const PodSpec& pod : pods) {
    const auto gpu = static_cast<double>(pod.gpu_milli_total());
    shares.total += gpu;
    if (pod.gpus == 0) ++shares.cpu_only;
    if (pod.gpus > 0) ++shares.gpu_pods;
    if (pod.gpus > 0 && !pod.models.empty()) ++shares.restricted;
    if (pod.shares_gpu()) shares.sharing += gpu;
    if (pod.gpus > 1) shares.multi += gpu;
  }
  shares.sharing /= shares.total;
  shares.multi /= shares.total;
  return shares;
}

class TraceGenerator : public ::testing::Test {
 protected:
  std::vector<NodeSpec> nodes_ = read_nodes(kData + "openb_node_list_gpu_node.csv");
  std::vector<PodSpec> source_ = read_pods(kData + "openb_pod_list_default.csv");
};

TEST_F(TraceGenerator, MeetsEachKindsShareOfTheGpuAndKeepsTheTotal) {
  const Shares before = measure(source_);
  for (const auto& [sharing, multi] : {std::pair{0.6, 0.2}, {0.05, 0.5}, {0.9, 0.0}}) {
    TraceShape shape;
    shape.sharing = sharing;
    shape.multi_gpu = multi;
    const Shares after = measure(generate_trace(source_, nodes_, shape, 7));
    // Each kind overshoots its target by less than one pod (at most 8 GPUs of 6 million milli).
    EXPECT_NEAR(after.sharing, sharing, 0.002) << sharing << "/" << multi;
    EXPECT_NEAR(after.multi, multi, 0.002) << sharing << "/" << multi;
    EXPECT_NEAR(after.total / before.total, 1, 0.004);
    EXPECT_EQ(after.cpu_only, before.cpu_only);
  }
}

TEST_F(TraceGenerator, LeavesWhatItIsNotAskedToChange) {
  const Shares before = measure(source_);
  const Shares after = measure(generate_trace(source_, nodes_, TraceShape{}, 3));
  EXPECT_NEAR(after.sharing, before.sharing, 0.002);
  EXPECT_NEAR(after.multi, before.multi, 0.002);
  EXPECT_EQ(after.restricted, 0);  // the default trace restricts no pod
}

TEST_F(TraceGenerator, RestrictsPodsToModelsWhoseNodesCouldHoldThem) {
  TraceShape shape;
  shape.gpu_spec = 1.0 / 3;
  const auto pods = generate_trace(source_, nodes_, shape, 11);
  const Shares shares = measure(pods);
  EXPECT_NEAR(static_cast<double>(shares.restricted) / shares.gpu_pods, 1.0 / 3, 0.03);
  std::map<std::string, long> by_model;
  for (const PodSpec& pod : pods) {
    if (pod.models.empty()) continue;
    ASSERT_EQ(pod.models.size(), 1u);
    ++by_model[pod.models[0]];
    bool held = false;
    for (const NodeSpec& node : nodes_) {
      held = held || (node.model == pod.models[0] && node.gpus >= pod.gpus &&
                      node.cpu_milli >= pod.cpu_milli && node.memory_mib >= pod.memory_mib);
    }
    EXPECT_TRUE(held) << pod.name << " restricted to " << pod.models[0];
  }
  // Weighed by the models' GPUs: G2 has 4,392 of 6,212, so most restricted pods ask for it.
  EXPECT_GT(by_model["G2"], shares.restricted / 2);
  EXPECT_GT(by_model.size(), 3u);
}

TEST_F(TraceGenerator, ScalesCpuWithinTheLargestNodeThatHoldsThePod) {
  TraceShape shape;
  shape.gpu_pod_cpu = 3;
  shape.cpu_only = 2;
  const auto pods = generate_trace(source_, nodes_, shape, 5);
  std::int64_t most_cpu_any = 0;
  for (const NodeSpec& node : nodes_) most_cpu_any = std::max(most_cpu_any, node.cpu_milli);
  double cpu_before = 0, cpu_after = 0;
  for (const PodSpec& pod : source_) cpu_before += pod.gpus > 0 ? double(pod.cpu_milli) : 0;
  for (const PodSpec& pod : pods) {
    if (pod.gpus == 0) continue;
    cpu_after += static_cast<double>(pod.cpu_milli);
    EXPECT_LE(pod.cpu_milli, most_cpu_any);
    EXPECT_EQ(pod.cpu_milli % 100, 0);
  }
  EXPECT_GT(cpu_after / cpu_before, 2.0);  // capped pods keep it under 3
  EXPECT_LT(cpu_after / cpu_before, 3.05);
  EXPECT_NEAR(static_cast<double>(measure(pods).cpu_only), 2.0 * measure(source_).cpu_only, 1);

  shape = TraceShape{};
  shape.cpu_only = 0;
  EXPECT_EQ(measure(generate_trace(source_, nodes_, shape, 5)).cpu_only, 0);
}

TEST_F(TraceGenerator, TheSameSeedGivesTheSameTrace) {
  TraceShape shape;
  shape.gpu_spec = 0.2;
  shape.sharing = 0.4;
  const auto first = generate_trace(source_, nodes_, shape, 9);
  const auto again = generate_trace(source_, nodes_, shape, 9);
  const auto other = generate_trace(source_, nodes_, shape, 10);
  ASSERT_EQ(first.size(), again.size());
  bool all_equal = true, other_differs = first.size() != other.size();
  for (std::size_t i = 0; i < first.size(); ++i) {
    all_equal = all_equal && first[i].cpu_milli == again[i].cpu_milli &&
                first[i].gpu_milli == again[i].gpu_milli && first[i].models == again[i].models;
    other_differs = other_differs || i >= other.size() || first[i].cpu_milli != other[i].cpu_milli;
  }
  EXPECT_TRUE(all_equal);
  EXPECT_TRUE(other_differs);
}

TEST_F(TraceGenerator, RefusesShapesItCannotDraw) {
  TraceShape shape;
  shape.sharing = 0.7;
  shape.multi_gpu = 0.5;
  EXPECT_NE(why_not_generable(source_, shape).find("more than all the GPU"), std::string::npos);
  EXPECT_THROW(generate_trace(source_, nodes_, shape, 1), std::invalid_argument);

  std::vector<PodSpec> no_multi;
  for (const PodSpec& pod : source_) {
    if (pod.gpus <= 1) no_multi.push_back(pod);
  }
  shape = TraceShape{};
  shape.multi_gpu = 0.1;
  EXPECT_EQ(why_not_generable(no_multi, shape),
            "the source trace has no multi-GPU pods to draw from");
  shape.multi_gpu = 0;  // none asked: none needed
  EXPECT_EQ(why_not_generable(no_multi, shape), "");

  for (double bad : {std::nan(""), 1.5}) {
    shape = TraceShape{};
    shape.gpu_spec = bad;
    EXPECT_NE(why_not_generable(source_, shape).find(fmt::format("gpu-spec share {}", bad)),
              std::string::npos)
        << bad;
  }
  for (double bad : {0.0, -1.0, std::nan(""), 1000.0}) {
    shape = TraceShape{};
    shape.gpu_pod_cpu = bad;
    EXPECT_NE(why_not_generable(source_, shape).find(fmt::format("gpu-pod-cpu factor {}", bad)),
              std::string::npos)
        << bad;
  }
  std::vector<PodSpec> cpu_only;
  for (const PodSpec& pod : source_) {
    if (pod.gpus == 0) cpu_only.push_back(pod);
  }
  EXPECT_EQ(why_not_generable(cpu_only, TraceShape{}), "the source trace has no GPU pods");
}

TEST_F(TraceGenerator, WritesATraceThatReadsBackTheSame) {
  test::ScratchDirectory scratch;
  TraceShape shape;
  shape.gpu_spec = 0.5;
  auto pods = generate_trace(source_, nodes_, shape, 2);
  pods[0].models = {"V100M16", "V100M32"};  // several models, as gpuspec10 has them
  ASSERT_FALSE(pods[1].qos.empty());        // drawn with the source's qos
  const std::string path = scratch.file("pods.csv");
  write_pods(path, pods);
  const auto read = read_pods(path);
  ASSERT_EQ(read.size(), pods.size());
  for (std::size_t i = 0; i < pods.size(); ++i) {
    EXPECT_EQ(read[i].name, pods[i].name);
    EXPECT_EQ(read[i].cpu_milli, pods[i].cpu_milli);
    EXPECT_EQ(read[i].memory_mib, pods[i].memory_mib);
    EXPECT_EQ(read[i].gpus, pods[i].gpus);
    EXPECT_EQ(read[i].gpu_milli, pods[i].gpu_milli);
    EXPECT_EQ(read[i].models, pods[i].models);
    EXPECT_EQ(read[i].qos, pods[i].qos);
  }
  EXPECT_THROW(write_pods(scratch.file("no/such/dir/pods.csv"), pods), std::runtime_error);
}

}  // namespace
}  // namespace tessera::sched
