// Pods sharing a GPU through tessera node, as they share it in a cluster: the agent serving a
// slices config on two simulated H100s, the test kubelet admitting pods and starting their
// containers, each container run as a runtime would start it (its mounts, /etc/ld.so.preload,
// never LD_PRELOAD). Containers of different pods meet in their GPU's one coordination file:
// priority, compute shares and bursting work between pods as between `tessera run` groups.
// Limits come from each container's own pod, whatever order pods are admitted in.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "contract/annotations.h"
#include "contract/host_layout.h"
#include "contract/layout.h"
#include "contract/pod_resources.h"
#include "contract/variables.h"
#include "device_record.h"
#include "kube/objects.h"
#include "ledger/demand.h"
#include "ledger/ledger.h"
#include "node_process.h"

namespace tessera::test {
namespace {

using namespace std::chrono_literals;
using contract::PodResource;
using contract::resource_name;

// Slices of each GPU, four per GPU.
constexpr const char* kSlices =
    "version: v1\nsharing:\n  slices:\n    resources:\n    - name: nvidia.com/gpu\n"
    "      replicas: 4\n";

// A node serving slices: its API server, kubelet and agent.
class SliceNode {
 public:
  explicit SliceNode(const std::string& config = kSlices)
      : kubelet_(scratch_.file("dp")), env_(machine(scratch_)) {
    cluster_.put("nodes", cluster_node("gpu-node"));
    std::ofstream(scratch_.file("config.yaml")) << config;
    node_ = std::make_unique<NodeProcess>(
        scratch_,
        std::vector<std::string>{"--config-file", scratch_.file("config.yaml"), "--api-server",
                                 cluster_.url()},
        env_);
    EXPECT_TRUE(node_->started()) << node_->log();
    EXPECT_TRUE(
        kubelet_.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 10s))
        << node_->log();
  }

  // A pod bound to this node, its GPU recorded as tessera scheduler records it.
  nlohmann::json bind(nlohmann::json pod, int gpu) {
    pod["spec"]["nodeName"] = "gpu-node";
    const kube::RecordedAssignment record{"gpu-node", {gpu}, {simulated_gpu_uuid(gpu)}, 0};
    pod["metadata"]["annotations"][contract::kAssignmentAnnotation] =
        kube::assignment_annotation(record);
    cluster_.put("pods", pod);
    return *cluster_.get("pods", FakeCluster::key_of("pods", pod));
  }
  // Admits the pod and starts its one container; what the runtime makes of it.
  ContainerSpec start(const nlohmann::json& pod) {
    std::vector<TestKubelet::AdmittedContainer> admitted;
    const TestKubelet::PodSpec spec = kubelet_pod(pod);
    const grpc::Status status = kubelet_.admit(spec, admitted);
    EXPECT_TRUE(status.ok()) << status.error_message() << "\n" << node_->log();
    if (!status.ok()) return {};
    const grpc::Status started =
        kubelet_.start(spec.name_space, spec.name, spec.containers.front().name);
    EXPECT_TRUE(started.ok()) << started.error_message() << "\n" << node_->log();
    return container_spec(admitted.front());
  }

  const ScratchDirectory& scratch() const { return scratch_; }
  FakeCluster& cluster() { return cluster_; }
  TestKubelet& kubelet() { return kubelet_; }
  const Environment& env() const { return env_; }
  NodeProcess& node() { return *node_; }

 private:
  ScratchDirectory scratch_;
  FakeCluster cluster_;
  TestKubelet kubelet_;
  Environment env_;
  std::unique_ptr<NodeProcess> node_;
};

// A HAMi pod: one GPU, its memory in MiB, its cores, its priority (-1: none asked).
nlohmann::json hami_pod(const std::string& name, int memory_mib, int cores, int priority = -1) {
  nlohmann::json pod = gpu_pod(name, 1, memory_mib, cores);
  if (priority >= 0) {
    pod["spec"]["containers"][0]["resources"]["limits"][resource_name(PodResource::priority)] =
        priority;
  }
  pod["metadata"]["annotations"] = nlohmann::json::object();
  return pod;
}

// The container's own ledger, as the node agent wrote it.
std::string ledger_of(const ContainerSpec& container) {
  for (const ContainerSpec::Mount& mount : container.mounts) {
    if (mount.container == contract::kContainerGroupDirectory) {
      return mount.host + "/" + contract::kLedgerFileName;
    }
  }
  return {};
}

// --- limits land on their own pod --------------------------------------------------------

enum class Admission { reverse, concurrent };

// Eight pods of different limits and priorities, created in order, admitted in reverse order or
// all at once, 100 times over: each container's ledger holds its own pod's limits, and it has
// its pod's GPU (or its pod's record says which it has).
void expect_every_pod_gets_its_own_limits(Admission admission) {
  SliceNode node;
  node.kubelet().set_concurrent_admission(admission == Admission::concurrent);
  constexpr int kRuns = 100, kPods = 8;
  int right = 0;
  for (int run = 0; run < kRuns; ++run) {
    std::vector<nlohmann::json> pods;
    for (int i = 0; i < kPods; ++i) {
      pods.push_back(
          node.bind(hami_pod(fmt::format("r{}-p{}", run, i), 1000 + 16 * i, 10 + i, i % 2), i % 2));
    }
    std::vector<ContainerSpec> containers(kPods);
    if (admission == Admission::reverse) {
      for (int i = kPods - 1; i >= 0; --i) containers[i] = node.start(pods[i]);
    } else {
      std::vector<std::thread> admitting;
      for (int i = 0; i < kPods; ++i) {
        admitting.emplace_back([&, i] { containers[i] = node.start(pods[i]); });
      }
      for (std::thread& thread : admitting) thread.join();
    }
    int own = 0;
    for (int i = 0; i < kPods; ++i) {
      ledger::Ledger ledger;
      ErrorText error;
      ASSERT_TRUE(ledger.open(ledger_of(containers[i]).c_str(), error))
          << "run " << run << " pod " << i << ": " << error.text << "\n"
          << node.node().log();
      const ledger::DeviceUsage usage = ledger.usage(0);
      const bool limits = usage.limit == (1000ull + 16 * i) << 20 &&
                          usage.cores == static_cast<std::uint32_t>(10 + i) &&
                          ledger.group_priority() == (i % 2 == 0 ? Priority::high : Priority::low);
      // Its GPU: the one assigned, or the one its pod's record was rewritten to.
      const nlohmann::json now = *node.cluster().get("pods", FakeCluster::key_of("pods", pods[i]));
      const kube::RecordedAssignment record = kube::assignment_from_annotation(
          now["metadata"]["annotations"][contract::kAssignmentAnnotation]);
      const bool gpu = containers[i].envs.at(contract::kVisibleDevicesVariable) ==
                       simulated_gpu_uuid(record.gpus.at(0));
      EXPECT_TRUE(limits) << "run " << run << " pod " << i << " got limit " << usage.limit
                          << ", cores " << usage.cores << ", priority "
                          << priority_name(ledger.group_priority());
      EXPECT_TRUE(gpu) << "run " << run << " pod " << i << " runs on "
                       << containers[i].envs.at(contract::kVisibleDevicesVariable)
                       << " but its record says GPU " << record.gpus.at(0);
      if (admission == Admission::reverse) {
        EXPECT_EQ(record.gpus.at(0), i % 2) << "one at a time, each gets the GPU assigned";
      }
      own += limits && gpu;
    }
    right += own == kPods;
    for (const nlohmann::json& pod : pods) {
      node.kubelet().remove("default", pod["metadata"]["name"]);
      node.cluster().remove("pods", FakeCluster::key_of("pods", pod));
    }
  }
  EXPECT_EQ(right, kRuns);
  const double rewritten = node.node().metric("tessera_assignments_rewritten_total");
  if (admission == Admission::reverse) {
    EXPECT_EQ(rewritten, 0) << "one at a time, none";
  }
  std::printf(
      "%s admission: every container had its own pod's limits in %d of %d runs; %.0f of %d "
      "containers got another GPU than assigned, and their pods' records say so\n",
      admission == Admission::reverse ? "reverse-order" : "concurrent", right, kRuns, rewritten,
      kRuns * kPods);
}

TEST(NodePods, LimitsLandOnTheirOwnPodWhenAdmittedInReverseCreationOrder) {
  expect_every_pod_gets_its_own_limits(Admission::reverse);
}

TEST(NodePods, LimitsLandOnTheirOwnPodWhenEightAreAdmittedAtOnce) {
  expect_every_pod_gets_its_own_limits(Admission::concurrent);
}

// A container started before its limits can be known (the kubelet's pod-resources API does not
// answer) is refused at PreStartContainer with the reason, and starts once it answers.
TEST(NodePods, AContainerWhoseLimitsCannotBeKnownDoesNotStart) {
  SliceNode node;
  const nlohmann::json pod = node.bind(hami_pod("lonely", 2048, 20), 0);
  std::vector<TestKubelet::AdmittedContainer> admitted;
  ASSERT_TRUE(node.kubelet().admit(kubelet_pod(pod), admitted).ok());
  // The kubelet forgets the pod (as after a restart of it with the pod gone): no holder.
  node.kubelet().remove("default", "lonely");
  const grpc::Status refused =
      node.kubelet().pre_start("nvidia.com/gpu", admitted.front().devices.at("nvidia.com/gpu"));
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error_message().find("names no container holding"), std::string::npos)
      << refused.error_message();
  // Its hook waits for the ledger, a bounded time, then refuses to run without one.
  const ContainerSpec container = container_spec(admitted.front());
  Environment quick = node.env();
  quick[contract::kLedgerWaitVariable] = "200";
  const Finished lonely = run(in_container(node.scratch(), container, {worker(), "init"}), quick);
  EXPECT_EQ(lonely.value("result"), "3") << "CUDA_ERROR_NOT_INITIALIZED: CUDA is refused";
  EXPECT_NE(lonely.err.find("the node agent has not given this container its limits"),
            std::string::npos)
      << lonely.err;
}

// --- coordination between pods -----------------------------------------------------------

// Two containers of two pods on GPU 0 meet in its one coordination file, whatever ordinal
// each calls it.
TEST(NodePods, ContainersOfDifferentPodsOnAGpuShareItsOneCoordinationFile) {
  SliceNode node;
  const ContainerSpec first = node.start(node.bind(hami_pod("first", 4096, 30), 0));
  const ContainerSpec second = node.start(node.bind(hami_pod("second", 4096, 30), 0));
  const ContainerSpec elsewhere = node.start(node.bind(hami_pod("elsewhere", 4096, 30), 1));
  auto coordination = [](const ContainerSpec& container) {
    std::vector<std::string> files;
    for (const ContainerSpec::Mount& mount : container.mounts) {
      if (mount.container.find(contract::kCoordinationSuffix) != std::string::npos) {
        files.push_back(mount.host);
      }
    }
    return files;
  };
  ASSERT_EQ(coordination(first).size(), 1u);
  EXPECT_EQ(coordination(first), coordination(second));
  EXPECT_NE(coordination(first), coordination(elsewhere));
  EXPECT_NE(ledger_of(first), ledger_of(second)) << "each its own ledger";
  for (const ContainerSpec::Mount& mount : first.mounts) {
    EXPECT_NE(mount.host + "/" + contract::kLedgerFileName, ledger_of(second))
        << "a container never sees another's ledger";
  }
}

// --- sharing a GPU between pods: timing ---------------------------------------------------
//
// Measured by the simulated device's own record of busy time, never by the limiter's beliefs;
// a lower bound is judged against what the host let the workload run (tests/support/host_record.h).

constexpr std::uint64_t kSettleNs = 100'000'000;  // the first 0.1 s: costs are being learned

// The interactive client: 1 ms kernels, each awaited, then 1 ms idle (50 % duty), 300 times.
Finished interactive_client(SliceNode& node, const ContainerSpec& container) {
  Finished done =
      run(in_container(node.scratch(), container, {worker(), "latency", "hi@1ms", "300", "1000"}),
          node.env());
  EXPECT_EQ(done.exit_code, 0) << done.err;
  return done;
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

// A high-priority pod's interactive client beside a low-priority pod saturating its GPU with
// kernels of `kernel`, in three rounds that alternate alone and beside: the medians of its p50
// and p90 beside stay within a tenth of alone. Batch kernels short enough for the client's
// 1 ms gaps keep at least a fifth of the device (of what the host let them run).
class PodPriority : public ::testing::TestWithParam<const char*> {};

TEST_P(PodPriority, AHighPriorityPodStaysWithinATenthOfAloneBesideALowPriorityPod) {
  const std::string kernel = GetParam();
  SliceNode node;
  const ContainerSpec interactive =
      node.start(node.bind(hami_pod("interactive", 8192, 0, /*priority=*/0), 0));
  const ContainerSpec batch = node.start(node.bind(hami_pod("batch", 8192, 0, /*priority=*/1), 0));
  std::vector<double> alone_p50, alone_p90, beside_p50, beside_p90, shares, allowed_shares;
  for (int round = 0; round < 3; ++round) {
    const std::vector<std::uint64_t> alone = completion_latencies(
        node.scratch(), interactive_client(node, interactive), kSettleNs, 0, kTwoGpus);
    Running saturating(
        in_container(node.scratch(), batch, {worker(), "saturate", "plain", "lo@" + kernel, "2.0"}),
        node.env());
    ASSERT_EQ(saturating.read_line(), "started");
    const Finished client = interactive_client(node, interactive);
    const Finished batch_run = saturating.finish();
    ASSERT_EQ(batch_run.exit_code, 0);
    const std::vector<std::uint64_t> beside =
        completion_latencies(node.scratch(), client, kSettleNs, 0, kTwoGpus);
    ASSERT_GE(alone.size(), 200u);
    ASSERT_GE(beside.size(), 200u);
    alone_p50.push_back(static_cast<double>(percentile(alone, 50)));
    alone_p90.push_back(static_cast<double>(percentile(alone, 90)));
    beside_p50.push_back(static_cast<double>(percentile(beside, 50)));
    beside_p90.push_back(static_cast<double>(percentile(beside, 90)));
    const std::uint64_t from = client.number("begin_ns") + kSettleNs, to = client.number("end_ns");
    shares.push_back(100 * share_of(node.scratch(),
                                    {static_cast<std::int32_t>(batch_run.number("pid"))}, from, to,
                                    0, kTwoGpus));
    allowed_shares.push_back(batch_run.host().allowed(from, to));
  }
  const double p50_alone = median_of(alone_p50), p90_alone = median_of(alone_p90);
  const double p50_beside = median_of(beside_p50), p90_beside = median_of(beside_p90);
  const double share = median_of(shares), allowed = median_of(allowed_shares);
  report("p50_alone_us", p50_alone / 1000);
  report("p50_beside_us", p50_beside / 1000);
  report("p90_alone_us", p90_alone / 1000);
  report("p90_beside_us", p90_beside / 1000);
  report("batch_share", share);
  std::printf("%s: p50 %.0f -> %.0f us (%+.1f %%), p90 %.0f -> %.0f us (%+.1f %%), batch %.1f %%\n",
              kernel.c_str(), p50_alone / 1000, p50_beside / 1000,
              100 * (p50_beside / p50_alone - 1), p90_alone / 1000, p90_beside / 1000,
              100 * (p90_beside / p90_alone - 1), share);
  EXPECT_LE(p50_beside, 1.1 * p50_alone) << "p50 beside a low-priority pod of " << kernel;
  EXPECT_LE(p90_beside, 1.1 * p90_alone) << "p90 beside a low-priority pod of " << kernel;
  if (kernel == "20us" || kernel == "200us") {
    EXPECT_GE(share, 20 * allowed) << "the host let the batch pod run " << 100 * allowed << " %";
  }
}

// What the coordination file does: the same low-priority pod, its container given a file of
// its own instead of its GPU's (as each container had before pods shared one), delays the
// high-priority pod's p90 by more than a tenth.
TEST(NodePods, WithoutItsGpusCoordinationFileALowPriorityPodDelaysAHighPriorityOne) {
  SliceNode node;
  const ContainerSpec interactive =
      node.start(node.bind(hami_pod("interactive", 8192, 0, /*priority=*/0), 0));
  ContainerSpec batch = node.start(node.bind(hami_pod("batch", 8192, 0, /*priority=*/1), 0));
  std::erase_if(batch.mounts, [](const ContainerSpec::Mount& mount) {
    return mount.container.find(contract::kCoordinationSuffix) != std::string::npos;
  });
  const std::vector<std::uint64_t> alone = completion_latencies(
      node.scratch(), interactive_client(node, interactive), kSettleNs, 0, kTwoGpus);
  Running saturating(
      in_container(node.scratch(), batch, {worker(), "saturate", "plain", "lo@1ms", "2.0"}),
      node.env());
  ASSERT_EQ(saturating.read_line(), "started");
  const std::vector<std::uint64_t> beside = completion_latencies(
      node.scratch(), interactive_client(node, interactive), kSettleNs, 0, kTwoGpus);
  saturating.kill_hard();
  EXPECT_GT(static_cast<double>(percentile(beside, 90)),
            1.1 * static_cast<double>(percentile(alone, 90)))
      << "p90 alone " << percentile(alone, 90) / 1000 << " us, beside "
      << percentile(beside, 90) / 1000 << " us";
}

// The GPU's coordination file written over (zeroes on its header) while a low-priority pod runs
// beside a high-priority one: the damage is said, naming the file, the file is made whole in
// place, and the low-priority pod gains nothing by it: the high-priority pod's p90 stays within
// a tenth of alone.
TEST(NodePods, ACoordinationFileWrittenOverIsSaidAndMadeWholeAndRaisesNoOne) {
  SliceNode node;
  const ContainerSpec interactive =
      node.start(node.bind(hami_pod("interactive", 8192, 0, /*priority=*/0), 0));
  const ContainerSpec batch = node.start(node.bind(hami_pod("batch", 8192, 0, /*priority=*/1), 0));
  std::string file;
  for (const ContainerSpec::Mount& mount : batch.mounts) {
    if (mount.container.find(contract::kCoordinationSuffix) != std::string::npos) file = mount.host;
  }
  ASSERT_FALSE(file.empty());
  const std::vector<std::uint64_t> alone = completion_latencies(
      node.scratch(), interactive_client(node, interactive), kSettleNs, 0, kTwoGpus);
  const std::string batch_log = node.scratch().file("batch.log");
  Running saturating(in_container(node.scratch(), batch,
                                  {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>" + batch_log, worker(),
                                   "saturate", "plain", "lo@200us", "2.0"}),
                     node.env());
  ASSERT_EQ(saturating.read_line(), "started");
  {
    std::fstream written_over(file, std::ios::in | std::ios::out | std::ios::binary);
    written_over << std::string(64, '\0');
  }
  const Finished client = interactive_client(node, interactive);
  const std::vector<std::uint64_t> beside =
      completion_latencies(node.scratch(), client, kSettleNs, 0, kTwoGpus);
  ASSERT_EQ(saturating.finish().exit_code, 0);
  contract::DeviceKey key;
  ASSERT_TRUE(contract::device_key_from_uuid(simulated_gpu_uuid(0).c_str(), key));
  const std::string said = read_text_file(batch_log) + client.err;
  EXPECT_NE(said.find(contract::container_coordination_file(key)), std::string::npos)
      << "the file, as the container names it: " << said;
  EXPECT_NE(said.find("written anew"), std::string::npos) << said;
  ledger::Demand whole;
  ErrorText error;
  EXPECT_TRUE(whole.open(file.c_str(), key, 1, error)) << error.text;
  EXPECT_LE(static_cast<double>(percentile(beside, 90)),
            1.1 * static_cast<double>(percentile(alone, 90)))
      << "p90 alone " << percentile(alone, 90) / 1000 << " us, beside "
      << percentile(beside, 90) / 1000 << " us";
}

INSTANTIATE_TEST_SUITE_P(NodePods, PodPriority, ::testing::Values("20us", "200us", "1ms", "5ms"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           return std::string(param.param);
                         });

// Two pods of equal priority saturating one GPU with 30 % and 70 % of it: each gets its share,
// to within two points (of what the host let it run, for the lower bound).
TEST(NodePods, PodsOfEqualPriorityGetTheirSharesOfTheGpu) {
  SliceNode node;
  const std::vector<int> asks = {30, 70};
  std::vector<std::unique_ptr<Running>> pods;
  for (const int percent : asks) {
    const ContainerSpec container =
        node.start(node.bind(hami_pod(fmt::format("share-{}", percent), 4096, percent), 0));
    pods.push_back(std::make_unique<Running>(
        in_container(node.scratch(), container,
                     {worker(), "saturate", "plain", "short@20us", "2.6"}),
        node.env()));
  }
  for (auto& pod : pods) ASSERT_EQ(pod->read_line(), "started");
  std::vector<Finished> runs;
  for (auto& pod : pods) runs.push_back(pod->finish());
  const std::uint64_t from =
      std::max(runs[0].number("begin_ns"), runs[1].number("begin_ns")) + 300'000'000;
  const std::uint64_t to = from + 2'000'000'000;
  for (std::size_t i = 0; i < asks.size(); ++i) {
    ASSERT_EQ(runs[i].exit_code, 0);
    const double share =
        100 * share_of(node.scratch(), {static_cast<std::int32_t>(runs[i].number("pid"))}, from, to,
                       0, kTwoGpus);
    const double allowed = runs[i].host().allowed(from, to);
    report(fmt::format("share_{}", asks[i]), share);
    std::printf("asked %d %%, got %.1f %% (the host let it run %.1f %%)\n", asks[i], share,
                100 * allowed);
    EXPECT_LE(share, asks[i] + 2.0) << "the cap of the " << asks[i] << " % pod";
    EXPECT_GE(share, asks[i] * allowed - 2.0)
        << "the " << asks[i] << " % pod; the host let it run " << 100 * allowed << " %";
  }
}

// A pod that may burst uses its idle neighbour's share, and gives it back within 100 ms of the
// neighbour's work starting.
TEST(NodePods, APodBurstsIntoAnIdleNeighboursShareAndGivesItBack) {
  SliceNode node;
  nlohmann::json bursting = hami_pod("bursting", 4096, 30);
  bursting["metadata"]["annotations"][contract::kBurstAnnotation] = "true";
  const ContainerSpec first = node.start(node.bind(bursting, 0));
  const ContainerSpec second = node.start(node.bind(hami_pod("neighbour", 4096, 70), 0));
  Running alone(
      in_container(node.scratch(), first, {worker(), "saturate", "plain", "mid@500us", "2.0"}),
      node.env());
  ASSERT_EQ(alone.read_line(), "started");
  // The scenario: the neighbour wakes 0.8 s later (a time in the experiment, not a wait for
  // anything to happen).
  std::this_thread::sleep_for(800ms);
  const Finished neighbour =
      run(in_container(node.scratch(), second, {worker(), "saturate", "plain", "mid@500us", "0.8"}),
          node.env());
  ASSERT_EQ(neighbour.exit_code, 0) << neighbour.err;
  const Finished burster = alone.finish();
  ASSERT_EQ(burster.exit_code, 0);
  expect_burst_given_back(node.scratch(), burster, neighbour, 0, kTwoGpus);
}

}  // namespace
}  // namespace tessera::test
