// The extender's cluster state alone: no HTTP, no API server. What fits where, what a bind
// holds and gives back, and how lists and watch events change what is held.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "extender/cluster_state.h"

namespace tessera::extender {
namespace {

using namespace std::chrono_literals;

NodeInfo gpu_node(const std::string& name, int gpus) {
  NodeInfo info;
  info.spec.name = name;
  info.spec.cpu_milli = 64000;
  info.spec.memory_mib = 256 * 1024;
  info.spec.gpus = gpus;
  info.spec.model = "A100-SXM4-80GB";
  info.gpu_memory_mib = 81920;
  for (int i = 0; i < gpus; ++i) info.gpu_uuids.push_back("GPU-" + name + std::to_string(i));
  return info;
}

PodRequest gpu_pod(const std::string& uid, int gpus, std::int64_t gpumem_mib = 0) {
  PodRequest pod;
  pod.uid = uid;
  pod.name = uid;
  pod.namespace_name = "default";
  pod.cpu_milli = 1000;
  pod.memory_mib = 1024;
  pod.gpus = gpus;
  pod.gpumem_mib = gpumem_mib;
  return pod;
}

std::string refusal(const ClusterState& state, const PodRequest& pod, const std::string& node) {
  Request request;
  int index = -1;
  return state.refusal(pod, node, request, index);
}

TEST(ExtenderState, APodFitsOnlyOnANodeWithRoomAndTheRefusalSaysWhy) {
  ClusterState state;
  state.replace_nodes({{"a", gpu_node("a", 2)}, {"cpu", gpu_node("cpu", 0)}});
  EXPECT_EQ(refusal(state, gpu_pod("p", 2), "a"), "");
  EXPECT_NE(refusal(state, gpu_pod("p", 3), "a").find("no room for 3 GPU(s)"), std::string::npos);
  EXPECT_NE(refusal(state, gpu_pod("p", 1), "cpu").find("no GPUs Tessera knows of"),
            std::string::npos);
  EXPECT_EQ(refusal(state, gpu_pod("p", 1), "elsewhere"), "node unknown to Tessera");
  EXPECT_NE(refusal(state, gpu_pod("p", 1, 90000), "a").find("a GPU here has 81920 MiB"),
            std::string::npos);
  EXPECT_TRUE(state.score(gpu_pod("p", 2), "a", Policy::best_fit).has_value());
  EXPECT_FALSE(state.score(gpu_pod("p", 3), "a", Policy::best_fit).has_value());
}

TEST(ExtenderState, ABindHoldsItsRoomUntilGivenBack) {
  ClusterState state;
  state.replace_nodes({{"a", gpu_node("a", 1)}});
  const auto now = ClusterState::Clock::now();
  std::string why;
  const auto first = state.reserve("p1", gpu_pod("p1", 1), "a", Policy::best_fit, now, why);
  ASSERT_TRUE(first.has_value()) << why;
  EXPECT_EQ(first->gpus, std::vector<int>{0});
  EXPECT_EQ(first->gpu_milli, kMilli);
  EXPECT_EQ(first->node_uuids, std::vector<std::string>{"GPU-a0"});
  EXPECT_EQ(state.size().pods_held, 1u);
  // The GPU is taken: a second pod does not fit, and says so.
  EXPECT_FALSE(state.reserve("p2", gpu_pod("p2", 1), "a", Policy::best_fit, now, why));
  EXPECT_NE(why.find("no room"), std::string::npos) << why;
  // The first bind failed: its room is free again.
  state.give_back("p1");
  EXPECT_EQ(state.size().pods_held, 0u);
  EXPECT_TRUE(state.reserve("p2", gpu_pod("p2", 1), "a", Policy::best_fit, now, why)) << why;
  // A second attempt of one pod replaces its first: it does not hold twice.
  EXPECT_TRUE(state.reserve("p2", gpu_pod("p2", 1), "a", Policy::best_fit, now, why)) << why;
  EXPECT_EQ(state.size().pods_held, 1u);
}

TEST(ExtenderState, HalfGpuPodsShareAGpuAndAThirdWaitsForRoom) {
  ClusterState state;
  state.replace_nodes({{"a", gpu_node("a", 1)}});
  const auto now = ClusterState::Clock::now();
  std::string why;
  EXPECT_TRUE(state.reserve("h1", gpu_pod("h1", 1, 40960), "a", Policy::best_fit, now, why));
  EXPECT_TRUE(state.reserve("h2", gpu_pod("h2", 1, 40960), "a", Policy::best_fit, now, why));
  EXPECT_NE(refusal(state, gpu_pod("h3", 1, 40960), "a"), "");
}

TEST(ExtenderState, AListReadBeforeABindLandedKeepsTheBindsRoomForAMinute) {
  ClusterState state;
  state.replace_nodes({{"a", gpu_node("a", 1)}});
  const auto bound_at = ClusterState::Clock::now();
  std::string why;
  ASSERT_TRUE(state.reserve("p1", gpu_pod("p1", 1), "a", Policy::best_fit, bound_at, why));
  // The list does not show the bind yet (the pod still waits there): the room stays held.
  state.replace_pods({}, {{"p1", gpu_pod("p1", 1)}}, bound_at + 5s);
  EXPECT_EQ(state.size().pods_held, 1u);
  EXPECT_EQ(state.size().pods_waiting, 0u);
  EXPECT_NE(refusal(state, gpu_pod("p2", 1), "a"), "");
  // A minute on, a list that still does not show it is believed.
  state.replace_pods({}, {}, bound_at + 61s);
  EXPECT_EQ(state.size().pods_held, 0u);
  EXPECT_EQ(refusal(state, gpu_pod("p2", 1), "a"), "");
}

TEST(ExtenderState, WatchEventsMoveHoldsAndAStatusUpdateChangesNothing) {
  ClusterState state;
  state.replace_nodes({{"a", gpu_node("a", 2)}});
  Hold hold;
  hold.node = "a";
  hold.pod = gpu_pod("p1", 1);
  hold.gpus = {1};
  state.pod_event("p1", false, hold, std::nullopt);
  EXPECT_EQ(state.size().pods_held, 1u);
  // GPU 1 is held: a two-GPU pod no longer fits, a one-GPU pod does (on GPU 0).
  EXPECT_NE(refusal(state, gpu_pod("p2", 2), "a"), "");
  EXPECT_EQ(refusal(state, gpu_pod("p2", 1), "a"), "");
  state.pod_event("p1", false, hold, std::nullopt);  // the same again: still one hold
  EXPECT_EQ(state.size().pods_held, 1u);
  state.pod_event("p1", true, std::nullopt, std::nullopt);  // deleted
  EXPECT_EQ(state.size().pods_held, 0u);
  EXPECT_EQ(refusal(state, gpu_pod("p2", 2), "a"), "");
  // A pod waiting for a node counts in the target workload, not among the holds.
  state.pod_event("w", false, std::nullopt, gpu_pod("w", 1));
  EXPECT_EQ(state.size().pods_waiting, 1u);
}

TEST(ExtenderState, PreemptionChoosesAmongTheNodesHoldsByPriority) {
  ClusterState state;
  state.replace_nodes({{"a", gpu_node("a", 2)}, {"b", gpu_node("b", 1)}});
  const auto hold_on = [&](const std::string& uid, const std::string& node, int gpu,
                           std::int32_t priority) {
    Hold hold;
    hold.node = node;
    hold.pod = gpu_pod(uid, 1);
    hold.pod.priority = priority;
    hold.gpus = {gpu};
    state.pod_event(uid, false, hold, std::nullopt);
  };
  hold_on("low", "a", 0, 0);
  hold_on("mid", "a", 1, 50);
  hold_on("elsewhere", "b", 0, 0);
  PodRequest urgent = gpu_pod("urgent", 1);
  urgent.priority = 100;
  using Victims = std::optional<std::vector<std::string>>;
  const auto victims_on = [&](const PodRequest& pod, const std::string& node) {
    return state.preemption_victims(pod, {node}).at(0);
  };
  EXPECT_EQ(victims_on(urgent, "a"), Victims(std::vector<std::string>{"low"}));
  urgent.gpus = 2;  // both of a's GPUs
  EXPECT_EQ(victims_on(urgent, "a"), Victims(std::vector<std::string>{"low", "mid"}));
  urgent.priority = 50;  // mid is an equal
  EXPECT_EQ(victims_on(urgent, "a"), std::nullopt);
  // What no eviction changes: too much GPU memory, an unknown node.
  EXPECT_EQ(victims_on(gpu_pod("huge", 1, 90000), "a"), std::nullopt);
  EXPECT_EQ(victims_on(urgent, "nowhere"), std::nullopt);
  // Several nodes at once, each with its own: b's one pod is below 100.
  urgent.priority = 100;
  urgent.gpus = 1;
  const auto both = state.preemption_victims(urgent, {"b", "nowhere", "a"});
  ASSERT_EQ(both.size(), 3u);
  EXPECT_EQ(both[0], Victims(std::vector<std::string>{"elsewhere"}));
  EXPECT_EQ(both[1], std::nullopt);
  EXPECT_EQ(both[2], Victims(std::vector<std::string>{"low"}));
  // A pod whose holds are gone fits as it is: no victims.
  state.pod_event("low", true, std::nullopt, std::nullopt);
  EXPECT_EQ(victims_on(urgent, "a"), Victims(std::vector<std::string>{}));
}

TEST(ExtenderState, ANodeDeletedOrChangedIsOfferedAsItIsNow) {
  ClusterState state;
  state.replace_nodes({{"a", gpu_node("a", 1)}});
  EXPECT_TRUE(state.knows(gpu_node("a", 1)));
  EXPECT_FALSE(state.knows(gpu_node("a", 2)));
  state.node_event("a", gpu_node("a", 2));
  EXPECT_EQ(refusal(state, gpu_pod("p", 2), "a"), "");
  state.node_event("a", std::nullopt);
  EXPECT_EQ(refusal(state, gpu_pod("p", 1), "a"), "node unknown to Tessera");
  state.update_nodes({gpu_node("b", 1)});  // as kube-scheduler sent it
  EXPECT_EQ(refusal(state, gpu_pod("p", 1), "b"), "");
  EXPECT_EQ(state.size().nodes, 1u);
}

TEST(ExtenderState, ModelsPastTheEnginesLimitAreReportedAndNotOffered) {
  std::vector<std::string> heard;
  ClusterState state([&](const std::string& text) { heard.push_back(text); });
  std::map<std::string, NodeInfo> nodes;
  for (int i = 0; i <= Cluster::kMostModels; ++i) {
    NodeInfo node = gpu_node("n" + std::to_string(i), 1);
    node.spec.model = "model-" + std::to_string(i);
    nodes[node.spec.name] = node;
  }
  state.replace_nodes(nodes);
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_NE(heard[0].find("one more than the"), std::string::npos) << heard[0];
  int refused = 0;
  for (const auto& [name, node] : nodes) refused += !refusal(state, gpu_pod("p", 1), name).empty();
  EXPECT_EQ(refused, 1);
}

}  // namespace
}  // namespace tessera::extender
