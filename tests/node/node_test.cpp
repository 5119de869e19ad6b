// tessera node as the kubelet meets it: the real binary on the simulated GPU, driven by the
// test kubelet over gRPC (registration, ListAndWatch, GetPreferredAllocation, Allocate,
// PreStartContainer), with device events raised from outside (tessera simgpu event), configs
// edited under it, and the fake API server for labels, config choice and slices.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "contract/annotations.h"
#include "contract/gpu_numbering.h"
#include "contract/layout.h"
#include "contract/variables.h"
#include "fake_cluster.h"
#include "kube/objects.h"
#include "ledger/ledger.h"
#include "node_process.h"
#include "support.h"
#include "test_kubelet.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// NVIDIA's MPS config for nvidia.com/gpu under `root`, the resource's other fields as given.
std::string mps_config(const std::string& root, const std::string& resource_fields) {
  return "version: v1\nflags:\n  mpsRoot: " + root +
         "\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n" + resource_fields;
}

std::string replicas_config(int replicas, const std::string& extra = "") {
  return "version: v1\nsharing:\n  timeSlicing:\n" + extra +
         "    resources:\n    - name: nvidia.com/gpu\n      replicas: " + std::to_string(replicas) +
         "\n";
}

void raise_event(const Environment& env, int device, const std::vector<std::string>& event) {
  std::vector<std::string> argv = {tessera(), "simgpu", "event", "--device",
                                   std::to_string(device)};
  argv.insert(argv.end(), event.begin(), event.end());
  const Finished done = run(argv, env);
  ASSERT_EQ(done.exit_code, 0) << done.err;
}

TEST(Node, WholeGpusAreServedWithNvidiasIdsTopologyAndAnswers) {
  ScratchDirectory scratch;
  TestKubelet kubelet(scratch.file("dp"));
  NodeProcess node(scratch, {}, machine(scratch));
  ASSERT_TRUE(node.started()) << node.log();
  TestKubelet::Devices devices;
  ASSERT_TRUE(kubelet.wait_for_devices(
      "nvidia.com/gpu", has_ids({simulated_gpu_uuid(0), simulated_gpu_uuid(1)}), 10s, &devices))
      << node.log();
  EXPECT_EQ(devices.at(simulated_gpu_uuid(0)).health, "Healthy");
  EXPECT_EQ(devices.at(simulated_gpu_uuid(0)).numa_nodes, std::vector<std::int64_t>{0});
  EXPECT_EQ(devices.at(simulated_gpu_uuid(1)).numa_nodes, std::vector<std::int64_t>{1});
  const auto registrations = kubelet.registrations();
  ASSERT_EQ(registrations.size(), 1u);
  EXPECT_EQ(registrations[0].version, "v1beta1");
  EXPECT_EQ(registrations[0].endpoint, "tessera-gpu.sock");
  EXPECT_TRUE(registrations[0].preferred_allocation);
  v1beta1::DevicePluginOptions options;
  ASSERT_TRUE(kubelet.options("nvidia.com/gpu", options).ok());
  EXPECT_TRUE(options.get_preferred_allocation_available());

  v1beta1::AllocateResponse response;
  ASSERT_TRUE(
      kubelet
          .allocate("nvidia.com/gpu",
                    {{simulated_gpu_uuid(1)}, {simulated_gpu_uuid(0), simulated_gpu_uuid(1)}},
                    response)
          .ok());
  ASSERT_EQ(response.container_responses_size(), 2);
  EXPECT_EQ(response.container_responses(0).envs().at(contract::kVisibleDevicesVariable),
            simulated_gpu_uuid(1));
  EXPECT_EQ(response.container_responses(1).envs().at(contract::kVisibleDevicesVariable),
            simulated_gpu_uuid(0) + "," + simulated_gpu_uuid(1));
  EXPECT_TRUE(kubelet.pre_start("nvidia.com/gpu", {simulated_gpu_uuid(1)}).ok());
  const grpc::Status unknown = kubelet.allocate("nvidia.com/gpu", {{"GPU-forged"}}, response);
  EXPECT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error_message(),
            "invalid allocation request for 'nvidia.com/gpu': unknown device: GPU-forged");
  EXPECT_EQ(node.metric("tessera_allocations_total{resource=\"nvidia.com/gpu\"}"), 2);
  EXPECT_EQ(node.metric("tessera_allocation_refusals_total{resource=\"nvidia.com/gpu\"}"), 1);
  EXPECT_EQ(node.stop(), 0);
  EXPECT_FALSE(fs::exists(scratch.file("dp/tessera-gpu.sock")));  // its socket goes with it
}

// MIG end to end on the simulated GPU: tessera mig lays GPU 0 out, and the node agent serves
// its MIG devices by profile (mixed) beside GPU 1 whole, and a container gets its MIG device.
TEST(Node, MigDevicesLaidOutByTesseraMigAreServedByProfile) {
  ScratchDirectory scratch;
  const Environment env = machine(scratch, "A100-80GB;A100-80GB", {{"TESSERA_SIMULATE", "1"}});
  const std::string layout = scratch.file("mig.yaml");
  write_config(layout,
               "version: v1\nmig-configs:\n  mixed:\n    - devices: [0]\n"
               "      mig-enabled: true\n      mig-devices: {\"3g.40gb\": 1, \"1g.10gb\": 2, "
               "\"1g.10gb+me\": 1}\n");
  const std::vector<std::string> apply = {tessera(), "mig", "apply", "-f", layout, "-c", "mixed"};
  ASSERT_EQ(run(apply, env).exit_code, 3);  // MIG on waits for a reset
  ASSERT_EQ(run({tessera(), "simgpu", "reset", "--device", "0"}, env).exit_code, 0);
  const Finished applied = run(apply, env);
  ASSERT_EQ(applied.exit_code, 0) << applied.out << applied.err;
  const std::string config = scratch.file("config.yaml");
  write_config(config, "version: v1\nflags:\n  migStrategy: mixed\n");

  TestKubelet kubelet(scratch.file("dp"));
  NodeProcess node(scratch, {"--config-file", config}, env);
  ASSERT_TRUE(node.started()) << node.log();
  TestKubelet::Devices whole, small, media, large;
  ASSERT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids({simulated_gpu_uuid(1)}), 10s, &whole))
      << node.log();
  const auto count_is = [](std::size_t count) {
    return [count](const TestKubelet::Devices& devices) { return devices.size() == count; };
  };
  ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/mig-1g.10gb", count_is(2), 10s, &small))
      << node.log();
  ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/mig-1g.10gb.me", count_is(1), 10s, &media))
      << node.log();
  ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/mig-3g.40gb", count_is(1), 10s, &large))
      << node.log();
  const std::string mig_uuid = large.begin()->first;
  EXPECT_EQ(mig_uuid.rfind("MIG-", 0), 0u) << mig_uuid;
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(kubelet.allocate("nvidia.com/mig-3g.40gb", {{mig_uuid}}, response).ok());
  EXPECT_EQ(response.container_responses(0).envs().at(contract::kVisibleDevicesVariable), mig_uuid);
  // A MIG device is not a whole GPU's to give: asked under another resource, refused.
  EXPECT_FALSE(kubelet.allocate("nvidia.com/gpu", {{mig_uuid}}, response).ok());
  EXPECT_EQ(node.stop(), 0);
}

// GPU 0 of `env`'s simulated A100-80GB cut into seven 1g.10gb instances, as tessera mig apply
// does it; the node config serving them by profile, or "" (with a failure) if the cut failed.
std::string cut_into_seven_small(const ScratchDirectory& scratch, const Environment& env) {
  const std::string layout = scratch.file("mig.yaml");
  write_config(layout,
               "version: v1\nmig-configs:\n  small:\n    - devices: [0]\n"
               "      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n");
  const std::vector<std::string> apply = {tessera(), "mig", "apply", "-f", layout, "-c", "small"};
  EXPECT_EQ(run(apply, env).exit_code, 3);  // MIG on waits for a reset
  EXPECT_EQ(run({tessera(), "simgpu", "reset", "--device", "0"}, env).exit_code, 0);
  if (run(apply, env).exit_code != 0) {
    ADD_FAILURE() << "the GPU was not cut";
    return {};
  }
  const std::string config = scratch.file("config.yaml");
  write_config(config, "version: v1\nflags:\n  migStrategy: mixed\n");
  return config;
}

// A node agent serving GPU 0 cut into seven 1g.10gb instances (migStrategy mixed), with the
// fake API server holding its node and the test kubelet.
class SmallMigNode : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(config.empty());
    cluster.put("nodes", cluster_node("gpu-node"));
    node_ = std::make_unique<NodeProcess>(
        scratch, std::vector<std::string>{"--config-file", config, "--api-server", cluster.url()},
        env);
    ASSERT_TRUE(node_->started()) << node_->log();
  }
  // Once the seven are served, a pod the kubelet admits holding one: its device ID ("" if not).
  std::string admit_holder() {
    const auto seven = [](const TestKubelet::Devices& devices) { return devices.size() == 7; };
    std::vector<TestKubelet::AdmittedContainer> admitted;
    if (!kubelet.wait_for_devices("nvidia.com/mig-1g.10gb", seven, 10s) ||
        !kubelet.admit({"default", "holder", {{"main", {{"nvidia.com/mig-1g.10gb", 1}}}}}, admitted)
             .ok()) {
      return {};
    }
    return admitted.at(0).devices.at("nvidia.com/mig-1g.10gb").at(0);
  }
  ScratchDirectory scratch;
  Environment env = machine(scratch, "A100-80GB", {{"TESSERA_SIMULATE", "1"}});
  std::string config = cut_into_seven_small(scratch, env);
  FakeCluster cluster;
  TestKubelet kubelet{scratch.file("dp")};
  std::unique_ptr<NodeProcess> node_;
};

// Dynamic MIG on the node: the layout annotation re-cuts the GPU around the instance a pod
// holds, the new devices are served, and a layout that would take the held instance, or is no
// layout, is refused on the node with the reason while the GPU keeps its cut.
TEST_F(SmallMigNode, TheMigLayoutAnnotationReCutsOnlyWhatNoPodHolds) {
  NodeProcess& node = *node_;
  const std::string held = admit_holder();
  ASSERT_FALSE(held.empty()) << node.log();
  const auto count_is = [](std::size_t count) {
    return [count](const TestKubelet::Devices& devices) { return devices.size() == count; };
  };

  const auto state_is = [&](const std::string& prefix) {
    return cluster.wait_for(
        "nodes", "gpu-node",
        [&](const nlohmann::json& object) {
          const auto& annotations = object["metadata"]["annotations"];
          return annotations.contains(contract::kMigLayoutStateAnnotation) &&
                 annotations[contract::kMigLayoutStateAnnotation].get<std::string>().rfind(prefix,
                                                                                           0) == 0;
        },
        10s);
  };
  const auto want = [&](const std::string& text) {
    cluster.patch("nodes", "gpu-node",
                  {{"metadata", {{"annotations", {{contract::kMigLayoutAnnotation, text}}}}}});
  };
  // 3g + three 1g: fits beside the held 1g wherever it sits.
  want(R"({"0": {"3g.40gb": 1, "1g.10gb": 3}})");
  ASSERT_TRUE(state_is("success")) << node.log();
  TestKubelet::Devices small;
  ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/mig-1g.10gb", count_is(3), 10s, &small))
      << node.log();
  EXPECT_EQ(small.count(held), 1u) << "the held instance keeps its device";
  ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/mig-3g.40gb", count_is(1), 10s)) << node.log();

  // One 7g would take the held 1g: refused, the cut unchanged.
  want(R"({"0": {"7g.80gb": 1}})");
  ASSERT_TRUE(state_is("failed: GPU 0")) << node.log();
  const std::string refused = cluster.get("nodes", "gpu-node")
                                  ->at("metadata")
                                  .at("annotations")
                                  .at(contract::kMigLayoutStateAnnotation);
  EXPECT_NE(refused.find("in use"), std::string::npos) << refused;
  want(R"({"0": {"1g.10gb": 9}})");
  ASSERT_TRUE(state_is("failed: tessera.io/mig-layout is not a layout")) << node.log();
  EXPECT_TRUE(kubelet.wait_for_devices("nvidia.com/mig-1g.10gb", count_is(3), 1s));
  EXPECT_TRUE(kubelet.wait_for_devices("nvidia.com/mig-3g.40gb", count_is(1), 1s));
  // Once the pod is gone, the whole GPU can be one 7g.
  kubelet.remove("default", "holder");
  want(R"({"0": {"7g.80gb": 1}})");
  ASSERT_TRUE(state_is("success")) << node.log();
  EXPECT_TRUE(kubelet.wait_for_devices("nvidia.com/mig-7g.80gb", count_is(1), 10s)) << node.log();
  EXPECT_EQ(node.stop(), 0);
}

// Dynamic MIG end to end: a MIG pod that fits nowhere makes the scheduler ask for a re-cut
// around the instance a pod holds, the node agent makes it, and the pod is placed.
TEST_F(SmallMigNode, TheSchedulerHasAGpuCutAgainForAMigPodAndPlacesItOnceCut) {
  NodeProcess& node = *node_;
  ASSERT_FALSE(admit_holder().empty()) << node.log();
  // The node says which instance is held, and where each sits.
  ASSERT_TRUE(cluster.wait_for(
      "nodes", "gpu-node",
      [](const nlohmann::json& object) {
        const auto& annotations = object["metadata"]["annotations"];
        if (!annotations.contains(contract::kGpusAnnotation)) return false;
        const nlohmann::json gpus =
            nlohmann::json::parse(annotations[contract::kGpusAnnotation].get<std::string>());
        int held = 0;
        for (const auto& device : gpus["gpus"][0]["mig_devices"])
          held += device.value("held", false) && device.contains("start");
        return held == 1 && gpus["gpus"][0]["mig_model"] == "A100-80GB";
      },
      10s))
      << node.log();

  SchedulerProcess scheduler(cluster, env);
  nlohmann::json big{
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "big"}, {"namespace", "default"}, {"uid", "uid-big"}}},
      {"spec",
       {{"schedulerName", "tessera"},
        {"containers",
         {{{"name", "main"}, {"resources", {{"limits", {{"nvidia.com/mig-3g.40gb", "1"}}}}}}}}}},
      {"status", {{"phase", "Pending"}}}};
  cluster.put("pods", big);
  std::string why;
  EXPECT_EQ(scheduler.schedule(*cluster.get("pods", "default/big"), {"gpu-node"}, why), "");
  EXPECT_NE(why.find("GPU 0 is being cut again for it"), std::string::npos) << why;
  ASSERT_TRUE(cluster.wait_for(
      "nodes", "gpu-node",
      [](const nlohmann::json& object) {
        return object["metadata"]["annotations"].value(contract::kMigLayoutStateAnnotation, "") ==
               "success";
      },
      10s))
      << node.log();
  // kube-scheduler tries the pod again: once the scheduler has seen the new devices, it fits.
  const auto deadline = Clock::now() + 10s;
  std::string placed;
  while (placed.empty() && Clock::now() < deadline) {
    placed = scheduler.schedule(*cluster.get("pods", "default/big"), {"gpu-node"}, why);
    if (placed.empty()) std::this_thread::sleep_for(50ms);  // kube-scheduler's backoff
  }
  EXPECT_EQ(placed, "gpu-node") << why;
  EXPECT_TRUE(kubelet.wait_for_devices(
      "nvidia.com/mig-3g.40gb",
      [](const TestKubelet::Devices& devices) { return devices.size() == 1; }, 10s));
  EXPECT_EQ(node.stop(), 0);
}

TEST(Node, RefusedArgumentsExitWithUsageAndSayWhy) {
  ScratchDirectory scratch;
  const Environment env = machine(scratch);
  struct Case {
    std::vector<std::string> arguments;
    const char* reason;
  };
  const Case cases[] = {
      {{"node", "--node-name", "GPU_Node/../x"}, "is not a Kubernetes node name"},
      {{"node", "--node-name", "n", "--replica-policy", "random"}, "must be distributed or packed"},
      {{"node", "--node-name", "n", "--recovery-period", "-1"}, "must be from 0 (never)"},
      {{"node", "--node-name", "n", "--config-file", "a", "--config-dir", "b"}, "use one"},
      {{"node", "--node-name", "n", "--metrics-listen", "9400"}, "is not HOST:PORT"},
      {{"simgpu", "event", "--device", "0"}, "say which event"},
      {{"simgpu", "event", "--device", "0", "--xid", "79", "--ecc", "double"}, "say which event"},
      {{"simgpu", "event", "--device", "0", "--ecc", "triple"}, "must be single or double"},
      {{"simgpu", "event", "--device", "7", "--xid", "79"}, "the simulated machine has 2 GPU(s)"},
  };
  for (const Case& test : cases) {
    std::vector<std::string> argv = {tessera()};
    argv.insert(argv.end(), test.arguments.begin(), test.arguments.end());
    const Finished done = run(argv, env);
    EXPECT_EQ(done.exit_code, 2) << test.reason;
    EXPECT_NE(done.err.find(test.reason), std::string::npos) << done.err;
  }
}

TEST(Node, TimeSlicingServesNvidiasReplicasRenamedOrNotAndRefusesAsNvidiaDoes) {
  ScratchDirectory scratch;
  TestKubelet kubelet(scratch.file("dp"));
  std::ofstream(scratch.file("config.yaml")) << read_text_file(example("seed-any.yaml"));
  {
    NodeProcess node(scratch, {"--config-file", scratch.file("config.yaml")}, machine(scratch));
    ASSERT_TRUE(node.started()) << node.log();
    ASSERT_TRUE(
        kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 10s))
        << node.log();
    // Distributed: two replicas go to two GPUs; one of them allocated already moves the next.
    std::vector<std::string> chosen;
    const auto all = simulated_replica_ids({0, 1}, 4);
    ASSERT_TRUE(kubelet.preferred("nvidia.com/gpu", {all.begin(), all.end()}, {}, 2, chosen).ok());
    ASSERT_EQ(chosen.size(), 2u);
    EXPECT_NE(chosen[0].substr(0, 40), chosen[1].substr(0, 40));
    // Two replicas of one GPU: the container sees that GPU once.
    v1beta1::AllocateResponse response;
    ASSERT_TRUE(kubelet
                    .allocate("nvidia.com/gpu",
                              {{simulated_gpu_uuid(0) + "::1", simulated_gpu_uuid(0) + "::3"}},
                              response)
                    .ok());
    EXPECT_EQ(response.container_responses(0).envs().at(contract::kVisibleDevicesVariable),
              simulated_gpu_uuid(0));
  }
  kubelet.restart();  // a fresh kubelet for the next config
  std::ofstream(scratch.file("config.yaml"), std::ios::trunc)
      << read_text_file(example("nvidia-time-slicing-renamed.yaml"));
  {
    NodeProcess node(scratch, {"--config-file", scratch.file("config.yaml")}, machine(scratch));
    ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/gpu.shared",
                                         has_ids(simulated_replica_ids({0, 1}, 10)), 10s))
        << node.log();
    EXPECT_EQ(kubelet.resources(), std::vector<std::string>{"nvidia.com/gpu.shared"});
    const auto registrations = kubelet.registrations();
    EXPECT_EQ(registrations.back().endpoint, "tessera-gpu.shared.sock");
  }
  kubelet.restart();
  std::ofstream(scratch.file("config.yaml"), std::ios::trunc)
      << read_text_file(example("nvidia-fail-requests.yaml"));
  {
    NodeProcess node(scratch, {"--config-file", scratch.file("config.yaml")}, machine(scratch));
    ASSERT_TRUE(
        kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 10)), 10s))
        << node.log();
    v1beta1::AllocateResponse response;
    const grpc::Status refused = kubelet.allocate(
        "nvidia.com/gpu", {{simulated_gpu_uuid(0) + "::0", simulated_gpu_uuid(1) + "::0"}},
        response);
    EXPECT_FALSE(refused.ok());
    EXPECT_EQ(refused.error_message(),
              "invalid request: maximum request size for shared resources is 1; found 2");
    EXPECT_TRUE(
        kubelet.allocate("nvidia.com/gpu", {{simulated_gpu_uuid(1) + "::7"}}, response).ok());
  }
}

TEST(Node, EveryExampleConfigIsServedAndAnInvalidOneStopsTheStartWithNvidiasMessage) {
  for (const auto& entry : fs::directory_iterator(example(""))) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".yaml" || name == "nvidia-mps.yaml") continue;
    SCOPED_TRACE(name);
    ScratchDirectory scratch;
    TestKubelet kubelet(scratch.file("dp"));
    NodeProcess node(scratch, {"--config-file", entry.path().string()}, machine(scratch));
    ASSERT_TRUE(node.started()) << node.log();
    const std::string resource =
        name.find("renamed") != std::string::npos ? "nvidia.com/gpu.shared" : "nvidia.com/gpu";
    ASSERT_TRUE(kubelet.wait_for_devices(
        resource, [](const auto& devices) { return !devices.empty(); }, 10s))
        << node.log();
  }
  ScratchDirectory scratch;
  std::ofstream(scratch.file("config.yaml"))
      << "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
         "    - name: nvidia.com/gpu\n      replicas: 1\n";
  NodeProcess node(scratch, {"--config-file", scratch.file("config.yaml")}, machine(scratch));
  EXPECT_FALSE(node.started());
  EXPECT_EQ(node.stop(), 1);
  EXPECT_NE(node.log().find(
                scratch.file("config.yaml") +
                ": sharing.timeSlicing.resources[0].replicas: number of replicas must be >= 2"),
            std::string::npos)
      << node.log();
}

TEST(Node, AKubeletRestartIsFollowedByRegistrationWithinASecond) {
  ScratchDirectory scratch;
  TestKubelet kubelet(scratch.file("dp"));
  std::ofstream(scratch.file("config.yaml")) << read_text_file(example("seed-any.yaml"));
  NodeProcess node(scratch, {"--config-file", scratch.file("config.yaml")}, machine(scratch));
  ASSERT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 10s))
      << node.log();
  for (int restart = 0; restart < 3; ++restart) {
    const auto before = Clock::now();
    kubelet.restart();
    TestKubelet::Registration registration;
    ASSERT_TRUE(kubelet.wait_for_registration("nvidia.com/gpu", before, 1s, &registration))
        << "restart " << restart << "\n"
        << node.log();
    EXPECT_LT(registration.at - before, 1s);
    // Served again on a new socket: the kubelet lists and allocates as before.
    ASSERT_TRUE(
        kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 5s));
    v1beta1::AllocateResponse response;
    EXPECT_TRUE(
        kubelet.allocate("nvidia.com/gpu", {{simulated_gpu_uuid(1) + "::2"}}, response).ok());
  }
}

TEST(Node, AnEditedConfigIsAppliedLiveWhileAllocateNeverFailsAndABadOneKeepsTheLastGood) {
  ScratchDirectory scratch;
  TestKubelet kubelet(scratch.file("dp"));
  write_config(scratch.file("config.yaml"), replicas_config(4));
  NodeProcess node(scratch, {"--config-file", scratch.file("config.yaml")}, machine(scratch));
  ASSERT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 10s))
      << node.log();

  // A stream of Allocate calls, as pods keep starting, for a device every config here has.
  std::atomic<bool> done{false};
  std::atomic<int> calls{0}, failures{0};
  std::string first_failure;
  std::thread allocating([&] {
    while (!done) {
      v1beta1::AllocateResponse response;
      const grpc::Status status =
          kubelet.allocate("nvidia.com/gpu", {{simulated_gpu_uuid(0) + "::1"}}, response);
      ++calls;
      if (!status.ok() && failures++ == 0) first_failure = status.error_message();
    }
  });
  // Each change is made while calls keep coming, and calls still come after it is applied.
  auto calls_continue = [&] {
    const int from = calls.load();
    const auto until = Clock::now() + 10s;
    while (calls.load() < from + 5 && Clock::now() < until) std::this_thread::yield();
    return calls.load() >= from + 5;
  };
  const double generation = node.metric("tessera_config_generation");
  ASSERT_TRUE(calls_continue());
  write_config(scratch.file("config.yaml"), replicas_config(8));
  EXPECT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 8)), 10s))
      << node.log();
  EXPECT_TRUE(calls_continue());
  write_config(scratch.file("config.yaml"),
               replicas_config(2, "    failRequestsGreaterThanOne: true\n"));
  EXPECT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 2)), 10s))
      << node.log();
  EXPECT_TRUE(calls_continue());
  // Refused: an unknown field. The last good config keeps serving.
  write_config(scratch.file("config.yaml"), replicas_config(3) + "    replicasPerGpu: 6\n");
  const auto refused_by = Clock::now() + 10s;
  while (node.metric("tessera_config_reload_errors_total") < 1 && Clock::now() < refused_by) {
    std::this_thread::sleep_for(50ms);  // polling the agent's own counter, not standing in for it
  }
  EXPECT_EQ(node.metric("tessera_config_reload_errors_total"), 1) << node.log();
  EXPECT_EQ(ids_of(kubelet.devices("nvidia.com/gpu")), simulated_replica_ids({0, 1}, 2));
  EXPECT_TRUE(calls_continue());
  write_config(scratch.file("config.yaml"), replicas_config(6));
  EXPECT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 6)), 10s))
      << node.log();
  EXPECT_TRUE(calls_continue());
  done = true;
  allocating.join();
  EXPECT_EQ(failures.load(), 0) << "first failure: " << first_failure;
  EXPECT_EQ(node.metric("tessera_config_generation"), generation + 3);
  // One registration only: every change went out on the open ListAndWatch stream.
  EXPECT_EQ(kubelet.registrations().size(), 1u);
  const std::string log = node.log();
  EXPECT_NE(
      log.find("config refused, the last good one keeps serving: " + scratch.file("config.yaml") +
               ": sharing.timeSlicing.replicasPerGpu: unknown field"),
      std::string::npos)
      << log;
}

TEST(Node, AnXidMakesEveryReplicaOfItsGpuUnhealthyWithinASecondAndTheGpuRecovers) {
  ScratchDirectory scratch;
  TestKubelet kubelet(scratch.file("dp"));
  std::ofstream(scratch.file("config.yaml")) << read_text_file(example("seed-any.yaml"));
  const Environment env = machine(scratch, kTwoGpus, {{"DP_DISABLE_HEALTHCHECKS", "94"}});
  NodeProcess node(scratch,
                   {"--config-file", scratch.file("config.yaml"), "--recovery-period", "2"}, env);
  ASSERT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 10s))
      << node.log();
  auto health_of = [](const TestKubelet::Devices& devices, int gpu) {
    std::set<std::string> health;
    for (const auto& [id, state] : devices) {
      if (id.rfind(simulated_gpu_uuid(gpu), 0) == 0) health.insert(state.health);
    }
    return health;
  };
  // Application XIDs (NVIDIA's list) and one this node ignores change nothing: they come first,
  // and the critical one after them finds GPU 0 healthy.
  raise_event(env, 0, {"--xid", "13"});
  raise_event(env, 0, {"--xid", "94"});
  raise_event(env, 0, {"--ecc", "single"});
  const auto raised = Clock::now();
  raise_event(env, 1, {"--xid", "79"});
  TestKubelet::Devices seen;
  ASSERT_TRUE(kubelet.wait_for_devices(
      "nvidia.com/gpu",
      [&](const auto& devices) {
        return health_of(devices, 1) == std::set<std::string>{"Unhealthy"};
      },
      1s, &seen))
      << node.log();
  EXPECT_LT(Clock::now() - raised, 1s);
  EXPECT_EQ(health_of(seen, 0), std::set<std::string>{"Healthy"});
  EXPECT_EQ(node.metric("tessera_gpu_healthy{gpu=\"1\",UUID=\"" + simulated_gpu_uuid(1) +
                        "\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node\"}"),
            0);
  EXPECT_EQ(node.metric("tessera_xid_events_total{xid=\"13\",Hostname=\"gpu-node\"}"), 1);
  // Quiet for the recovery period (2 s): healthy again, every replica.
  ASSERT_TRUE(kubelet.wait_for_devices(
      "nvidia.com/gpu",
      [&](const auto& devices) {
        return health_of(devices, 1) == std::set<std::string>{"Healthy"};
      },
      10s))
      << node.log();
  EXPECT_GE(Clock::now() - raised, 2s);
  // An uncorrectable ECC error is as bad as a critical XID.
  raise_event(env, 0, {"--ecc", "double"});
  EXPECT_TRUE(kubelet.wait_for_devices(
      "nvidia.com/gpu",
      [&](const auto& devices) {
        return health_of(devices, 0) == std::set<std::string>{"Unhealthy"};
      },
      1s))
      << node.log();
}

// MPS as NVIDIA's config asks for it: GPU 0 shared through a daemon under mpsRoot, started
// with NVIDIA's defaults (checked from the simulated daemon's own record), its containers
// given the pipe and the MPS shared memory, and a client held to its share; the daemon,
// killed with -9, makes that GPU's replicas unhealthy within 2 s, is restarted, and they
// recover, while GPU 1 (whole, no MPS) is untouched throughout.
TEST(Node, MpsDaemonsAreStartedWithNvidiasLimitsSupervisedAndRestarted) {
  ScratchDirectory scratch;
  TestKubelet kubelet(scratch.file("dp"));
  const std::string root = scratch.file("mps");
  std::ofstream(scratch.file("config.yaml")) << mps_config(
      root, "      rename: nvidia.com/gpu.mps\n      devices: [0]\n      replicas: 4\n");
  const Environment env = machine(scratch);
  NodeProcess node(scratch, {"--config-file", scratch.file("config.yaml")}, env);
  ASSERT_TRUE(node.started()) << node.log();
  std::set<std::string> replicas = simulated_replica_ids({0}, 4);
  ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/gpu.mps", has_ids(replicas), 10s)) << node.log();
  ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/gpu", has_ids({simulated_gpu_uuid(1)}), 10s));

  // The daemon's own record: NVIDIA's defaults, 100/4 % and a quarter of GPU 0's memory.
  const std::string resource_dir = root + "/nvidia.com/gpu.mps";
  const std::string record = read_text_file(resource_dir + "/log/control.log");
  const std::uint64_t memory = run({worker(), "info"}, env).number("device_total");
  EXPECT_NE(record.find("Accepting command: set_default_active_thread_percentage 25"),
            std::string::npos)
      << record;
  EXPECT_NE(record.find("Accepting command: set_default_device_pinned_mem_limit 0 " +
                        std::to_string((memory / 4) >> 20) + "M"),
            std::string::npos)
      << record;

  // A container of the resource gets the pipe and MPS's shared memory; a client there is
  // held to a quarter of the GPU.
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(kubelet.allocate("nvidia.com/gpu.mps", {{*replicas.begin()}}, response).ok());
  const auto& container = response.container_responses(0);
  EXPECT_EQ(container.envs().at("CUDA_MPS_PIPE_DIRECTORY"), resource_dir + "/pipe");
  std::set<std::pair<std::string, std::string>> mounts;
  for (const auto& mount : container.mounts())
    mounts.insert({mount.container_path(), mount.host_path()});
  EXPECT_EQ(mounts.count({resource_dir + "/pipe", resource_dir + "/pipe"}), 1u);
  EXPECT_EQ(mounts.count({"/dev/shm", root + "/shm"}), 1u);
  Environment client = env;
  client["CUDA_MPS_PIPE_DIRECTORY"] = container.envs().at("CUDA_MPS_PIPE_DIRECTORY");
  client["CUDA_VISIBLE_DEVICES"] = simulated_gpu_uuid(0);
  const Finished filled = run({worker(), "fill", std::to_string(256 << 20)}, client);
  EXPECT_LE(filled.number("allocated") + filled.number("driver_used"), memory / 4);
  EXPECT_GT(filled.number("allocated") + filled.number("driver_used") + (256 << 20), memory / 4);

  // kill -9 the daemon.
  std::smatch found;
  const std::string log = node.log();
  ASSERT_TRUE(std::regex_search(
      log, found, std::regex("MPS daemon of nvidia.com/gpu.mps running \\(PID ([0-9]+)\\)")))
      << log;
  const std::size_t updates_before = kubelet.updates("nvidia.com/gpu.mps").size();
  const auto killed = Clock::now();
  ASSERT_EQ(kill(std::stoi(found[1]), SIGKILL), 0);
  auto all = [](const TestKubelet::Devices& devices, const std::string& health) {
    return !devices.empty() && std::all_of(devices.begin(), devices.end(), [&](const auto& entry) {
      return entry.second.health == health;
    });
  };
  // An unhealthy list within 2 s of the kill, then a healthy one (the kubelet's record of
  // every list sent, read as it grows: the two may come closer together than a wait sees).
  bool went_down = false, came_back = false;
  for (const auto deadline = Clock::now() + 15s; !came_back && Clock::now() < deadline;) {
    const auto updates = kubelet.updates("nvidia.com/gpu.mps");
    for (std::size_t i = updates_before; i < updates.size() && !came_back; ++i) {
      if (!went_down && all(updates[i].devices, "Unhealthy")) {
        went_down = true;
        EXPECT_LT(updates[i].at - killed, 2s);
      }
      came_back = went_down && all(updates[i].devices, "Healthy");
    }
    std::this_thread::sleep_for(20ms);  // polling the kubelet's record
  }
  EXPECT_TRUE(came_back) << node.log();
  EXPECT_TRUE(went_down) << node.log();
  EXPECT_NE(node.log().find("MPS daemon of nvidia.com/gpu.mps running again"), std::string::npos);
  // The restarted daemon serves clients again, with the same limits.
  const Finished again = run({worker(), "fill", std::to_string(256 << 20)}, client);
  EXPECT_EQ(again.number("allocated"), filled.number("allocated"));
  // A hung daemon (stopped, its socket still accepting) is found by its silence, replaced,
  // and its GPU recovers the same way.
  const std::string log_after_restart = node.log();
  ASSERT_TRUE(std::regex_search(log_after_restart, found,
                                std::regex("MPS daemon of nvidia.com/gpu.mps running again "
                                           "\\(PID ([0-9]+)\\)")));
  const pid_t hung = std::stoi(found[1]);
  const std::size_t updates_before_hang = kubelet.updates("nvidia.com/gpu.mps").size();
  ASSERT_EQ(kill(hung, SIGSTOP), 0);
  went_down = came_back = false;
  for (const auto deadline = Clock::now() + 20s; !came_back && Clock::now() < deadline;) {
    const auto updates = kubelet.updates("nvidia.com/gpu.mps");
    for (std::size_t i = updates_before_hang; i < updates.size() && !came_back; ++i) {
      went_down = went_down || all(updates[i].devices, "Unhealthy");
      came_back = went_down && all(updates[i].devices, "Healthy");
    }
    std::this_thread::sleep_for(20ms);  // polling the kubelet's record
  }
  EXPECT_TRUE(came_back) << node.log();
  EXPECT_NE(node.log().find("its pipe does not answer"), std::string::npos) << node.log();
  kill(hung, SIGKILL);  // if the agent had not
  // GPU 1 never changed.
  for (const auto& update : kubelet.updates("nvidia.com/gpu")) {
    EXPECT_TRUE(all(update.devices, "Healthy"));
  }
}

// The GPUs' time slice (nvidia-smi compute-policy) is set only where the config asks, again
// when it changes, and a tool that fails leaves the node serving and says so.
TEST(Node, TheTimeSliceIsSetOnlyWhenTheConfigAsksAndFollowsItsChanges) {
  ScratchDirectory scratch;
  TestKubelet kubelet(scratch.file("dp"));
  const Environment env = machine(scratch);
  const std::string smi = build_path("sim/nvidia-smi");
  auto timeslices = [&] { return run({smi, "compute-policy", "-l"}, env).out; };
  const std::string config = scratch.file("config.yaml");
  write_config(config, replicas_config(2));
  {
    NodeProcess node(scratch, {"--config-file", config}, env);
    ASSERT_TRUE(node.started()) << node.log();
    ASSERT_TRUE(
        kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 2)), 10s));
    EXPECT_EQ(timeslices(), "GPU 0: timeslice Default\nGPU 1: timeslice Default\n");
    EXPECT_EQ(node.log().find("time slice"), std::string::npos) << node.log();
  }
  write_config(config, "version: v1\nflags:\n  computeTimeslice: short\n" +
                           replicas_config(2).substr(std::string("version: v1\n").size()));
  NodeProcess node(scratch, {"--config-file", config}, env);
  ASSERT_TRUE(node.started()) << node.log();
  EXPECT_EQ(timeslices(), "GPU 0: timeslice Short\nGPU 1: timeslice Short\n");  // before serving
  EXPECT_NE(node.log().find("time slice short set on 2 GPU(s)"), std::string::npos) << node.log();
  write_config(config, "version: v1\nflags:\n  computeTimeslice: long\n" +
                           replicas_config(4).substr(std::string("version: v1\n").size()));
  ASSERT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 10s))
      << node.log();
  EXPECT_EQ(timeslices(), "GPU 0: timeslice Long\nGPU 1: timeslice Long\n");
  EXPECT_EQ(node.stop(), 0);

  // An nvidia-smi that fails: the node serves, and says the slice stays as it was.
  NodeProcess failing(scratch, {"--config-file", config, "--nvidia-smi", "/bin/false"}, env);
  ASSERT_TRUE(failing.started()) << failing.log();
  EXPECT_NE(failing.log().find("GPU 0: the time slice stays as it was: /bin/false exited 1"),
            std::string::npos)
      << failing.log();
}

TEST(Node, WithoutAnApiServerItServesFromTheConfigAndSaysOnceWhatNeedsOne) {
  ScratchDirectory scratch;
  TestKubelet kubelet(scratch.file("dp"));
  fs::create_directory(scratch.file("features.d"));
  std::ofstream(scratch.file("config.yaml")) << read_text_file(example("seed-tesla-t4.yaml"));
  NodeProcess node(
      scratch,
      {"--config-file", scratch.file("config.yaml"), "--features-dir", scratch.file("features.d")},
      machine(scratch, "T4,context=0;T4,context=0;T4,context=0;T4,context=0"));
  ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/gpu",
                                       has_ids(simulated_replica_ids({0, 1, 2, 3}, 4)), 10s))
      << node.log();
  // The features file is written when the config is applied, before the plugins register.
  const std::string features = read_text_file(scratch.file("features.d/tessera-gpu"));
  for (const char* label : {"nvidia.com/gpu.count=4\n", "nvidia.com/gpu.product=Tesla-T4-SHARED\n",
                            "nvidia.com/gpu.replicas=4\n", "nvidia.com/gpu.sharing=timeslice\n"}) {
    EXPECT_NE(features.find(label), std::string::npos) << label << " not in\n" << features;
  }
  const std::string log = node.log();
  const std::string said = "no API server: serving the kubelet from the config alone";
  EXPECT_NE(log.find(said), std::string::npos) << log;
  EXPECT_EQ(log.find(said), log.rfind(said));  // once
}

TEST(Node, ItLabelsAndAnnotatesItsNodeAndTheNodeLabelChoosesTheConfig) {
  ScratchDirectory scratch;
  FakeCluster cluster;
  cluster.put("nodes", cluster_node("gpu-node"));
  TestKubelet kubelet(scratch.file("dp"));
  fs::create_directory(scratch.file("configs"));
  std::ofstream(scratch.file("configs/any")) << replicas_config(4);
  std::ofstream(scratch.file("configs/small")) << replicas_config(2);
  NodeProcess node(
      scratch,
      {"--config-dir", scratch.file("configs"), "--config", "any", "--api-server", cluster.url()},
      machine(scratch));
  ASSERT_TRUE(node.started()) << node.log();
  ASSERT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 10s))
      << node.log();
  auto label = [](const char* key, const std::string& value) {
    return [key, value](const nlohmann::json& object) {
      return object["metadata"]["labels"].value(key, std::string()) == value;
    };
  };
  ASSERT_TRUE(cluster.wait_for("nodes", "gpu-node", label("nvidia.com/gpu.replicas", "4"), 10s))
      << node.log();
  const nlohmann::json labelled = *cluster.get("nodes", "gpu-node");
  EXPECT_EQ(labelled["metadata"]["labels"]["nvidia.com/gpu.product"],
            "NVIDIA-H100-80GB-HBM3-SHARED");
  EXPECT_EQ(labelled["metadata"]["labels"]["nvidia.com/gpu.sharing"], "timeslice");
  EXPECT_EQ(labelled["metadata"]["annotations"][contract::kConfigAnnotation], "any");
  const nlohmann::json gpus = nlohmann::json::parse(
      labelled["metadata"]["annotations"][contract::kGpusAnnotation].get<std::string>());
  ASSERT_EQ(gpus["gpus"].size(), 2u);
  EXPECT_EQ(gpus["gpus"][1]["uuid"], simulated_gpu_uuid(1));
  EXPECT_EQ(gpus["gpus"][1]["sharing"], "timeslice");

  // The label NVIDIA's plugin reads chooses the config, live.
  cluster.patch("nodes", "gpu-node",
                {{"metadata", {{"labels", {{"nvidia.com/device-plugin.config", "small"}}}}}});
  ASSERT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 2)), 10s))
      << node.log();
  EXPECT_TRUE(cluster.wait_for("nodes", "gpu-node", label("nvidia.com/gpu.replicas", "2"), 10s));
  // A label naming no config: refused, shown on the node, the last good config serving.
  cluster.patch("nodes", "gpu-node",
                {{"metadata", {{"labels", {{"nvidia.com/device-plugin.config", "a100-80gb"}}}}}});
  ASSERT_TRUE(cluster.wait_for(
      "nodes", "gpu-node",
      [](const nlohmann::json& object) {
        return object["metadata"]["annotations"]
                   .value(contract::kConfigErrorAnnotation, std::string())
                   .find("a100-80gb") != std::string::npos;
      },
      10s))
      << node.log();
  EXPECT_EQ(ids_of(kubelet.devices("nvidia.com/gpu")), simulated_replica_ids({0, 1}, 2));
  cluster.patch("nodes", "gpu-node",
                {{"metadata", {{"labels", {{"nvidia.com/device-plugin.config", nullptr}}}}}});
  ASSERT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 10s))
      << node.log();
  EXPECT_TRUE(cluster.wait_for(
      "nodes", "gpu-node",
      [](const nlohmann::json& object) {
        return !object["metadata"]["annotations"].contains(contract::kConfigErrorAnnotation);
      },
      10s));
}

// MPS pins memory per process: a container of three clients could take three replicas' worth.
// The hook's ledger holds the container to its replica's share across all its processes.
TEST(Node, AnMpsContainerIsHeldToItsReplicasMemoryAcrossAllItsProcesses) {
  ScratchDirectory scratch;
  TestKubelet kubelet(scratch.file("dp"));
  const std::string root = scratch.file("mps");
  std::ofstream(scratch.file("config.yaml")) << mps_config(root, "      replicas: 4\n");
  const Environment env = machine(scratch, "H100,context=0,numa=0");
  NodeProcess node(scratch, {"--config-file", scratch.file("config.yaml")}, env);
  ASSERT_TRUE(node.started()) << node.log();
  const std::set<std::string> replicas = simulated_replica_ids({0}, 4);
  ASSERT_TRUE(kubelet.wait_for_devices("nvidia.com/gpu", has_ids(replicas), 10s)) << node.log();
  const std::uint64_t memory = run({worker(), "info"}, env).number("device_total");
  const std::uint64_t share = (memory / 4) >> 20 << 20;

  v1beta1::AllocateResponse response;
  ASSERT_TRUE(kubelet.allocate("nvidia.com/gpu", {{*replicas.begin()}}, response).ok())
      << node.log();
  const auto& container = response.container_responses(0);
  EXPECT_EQ(container.envs().at(contract::kMemoryLimitVariable), "0=" + std::to_string(share));
  EXPECT_EQ(container.envs().count(contract::kCoreLimitVariable), 0u);  // MPS's thread share
  TestKubelet::AdmittedContainer admitted{"main", {}, {container}};
  const ContainerSpec inside = container_spec(admitted);
  ContainerSpec mps_alone;  // the same container as NVIDIA's plugin would give it
  for (const char* name : {"CUDA_MPS_PIPE_DIRECTORY", contract::kVisibleDevicesVariable}) {
    mps_alone.envs[name] = container.envs().at(name);
  }
  for (const ContainerSpec::Mount& mount : inside.mounts) {
    if (mount.container.rfind(contract::kContainerGroupDirectory, 0) != 0 &&
        mount.container != contract::kContainerPreloadPath &&
        mount.container != contract::kContainerHookPath) {
      mps_alone.mounts.push_back(mount);
    }
  }

  // Three clients, each asking for 40 % of the share (MPS lets each have all of it), started
  // one after another and holding what they got.
  const std::string each = std::to_string(share * 2 / 5);
  auto three_clients = [&](const ContainerSpec& spec) {
    std::vector<std::unique_ptr<Running>> clients;
    std::vector<std::string> results;
    for (int i = 0; i < 3; ++i) {
      clients.push_back(
          std::make_unique<Running>(in_container(scratch, spec, {worker(), "hold", each}), env));
      results.push_back(clients.back()->read_line());
    }
    for (auto& client : clients) {
      client->close_stdin();
      EXPECT_EQ(client->wait(), 0);
    }
    return results;
  };
  EXPECT_EQ(three_clients(mps_alone),
            (std::vector<std::string>{"result=0", "result=0", "result=0"}))
      << "MPS alone was expected to let each process have its share";
  // Under the hook, the third finds the container's share taken: out of memory (2).
  EXPECT_EQ(three_clients(inside), (std::vector<std::string>{"result=0", "result=0", "result=2"}))
      << node.log();
  // What the clients held went back with them: one process has the whole share again, less
  // what MPS counts for its context.
  const Finished filled =
      run(in_container(scratch, inside, {worker(), "fill", std::to_string(64ull << 20)}), env);
  ASSERT_EQ(filled.exit_code, 0) << filled.err;
  EXPECT_EQ(filled.number("total"), share);
  EXPECT_LE(filled.number("allocated") + filled.number("driver_used"), share);
  EXPECT_GT(filled.number("allocated") + filled.number("driver_used") + (64ull << 20), share);
  EXPECT_NE(node.log().find("for all the container's processes"), std::string::npos);
  // The operator sees the container's refusal.
  const std::string metrics = node.metrics();
  EXPECT_TRUE(std::regex_search(
      metrics, std::regex("\ntessera_container_memory_refusals_total\\{[^}]*\\} [1-9]")))
      << metrics;
}

// A slice pod placed by tessera scheduler and admitted by the kubelet: its container, started
// with /etc/ld.so.preload as a runtime would, sees its pod's memory and is refused past it, and
// its launches are held to its cores; the operator sees its limit on the GPU the scheduler
// chose. Three pods of different sizes, admitted one after another in the order created.
TEST(Node, ASlicePodScheduledByTesseraGetsExactlyItsMemoryAndCores) {
  ScratchDirectory scratch;
  FakeCluster cluster;
  cluster.put("nodes", cluster_node("gpu-node"));
  TestKubelet kubelet(scratch.file("dp"));
  std::ofstream(scratch.file("config.yaml")) << read_text_file(example("tessera-slices.yaml"));
  const Environment env = machine(scratch);
  NodeProcess node(
      scratch, {"--config-file", scratch.file("config.yaml"), "--api-server", cluster.url()}, env);
  ASSERT_TRUE(node.started()) << node.log();
  ASSERT_TRUE(
      kubelet.wait_for_devices("nvidia.com/gpu", has_ids(simulated_replica_ids({0, 1}, 4)), 10s))
      << node.log();
  ASSERT_TRUE(cluster.wait_for(
      "nodes", "gpu-node",
      [](const nlohmann::json& object) {
        return object["metadata"]["annotations"].contains(contract::kGpusAnnotation);
      },
      10s));
  SchedulerProcess scheduler(cluster, env);
  const std::vector<std::pair<int, int>> asks = {{2048, 30}, {4096, 0}, {6144, 50}};
  std::vector<std::vector<TestKubelet::AdmittedContainer>> admitted(asks.size());
  for (std::size_t i = 0; i < asks.size(); ++i) {
    const std::string name = "slice-" + std::to_string(i);
    cluster.put("pods", gpu_pod(name, 1, asks[i].first, asks[i].second));
    std::string why;
    ASSERT_EQ(scheduler.schedule(*cluster.get("pods", "default/" + name), {"gpu-node"}, why),
              "gpu-node")
        << why;
    const nlohmann::json pod = *cluster.get("pods", "default/" + name);
    ASSERT_TRUE(kubelet.admit(kubelet_pod(pod), admitted[i]).ok()) << node.log();
    ASSERT_TRUE(kubelet.start("default", name, "main").ok()) << node.log();
  }
  // The 6 GiB, 50 % pod's container: its process sees 6 GiB and is refused past it.
  const ContainerSpec container = container_spec(admitted[2][0]);
  EXPECT_EQ(container.envs.count("LD_PRELOAD"), 0u);
  const Finished filled =
      run(in_container(scratch, container, {worker(), "fill", std::to_string(64ull << 20)}), env);
  ASSERT_EQ(filled.exit_code, 0) << filled.err << node.log();
  EXPECT_EQ(filled.number("total"), 6144ull << 20);
  EXPECT_EQ(filled.number("allocated"), 6144ull << 20);
  EXPECT_EQ(filled.number("error"), 2u);  // CUDA_ERROR_OUT_OF_MEMORY past the limit
  // Its cores: the ledger the node agent made holds 50 %, and launches are held to it.
  const Finished saturated = run(
      in_container(scratch, container, {worker(), "saturate", "plain", "short@100us", "1.0"}), env);
  ASSERT_EQ(saturated.exit_code, 0) << saturated.err;
  std::string group;
  for (const ContainerSpec::Mount& mount : container.mounts) {
    if (mount.container == contract::kContainerGroupDirectory) group = mount.host;
  }
  ledger::Ledger ledger;
  ErrorText error;
  ASSERT_TRUE(ledger.open((group + "/" + contract::kLedgerFileName).c_str(), error)) << error.text;
  const ledger::DeviceUsage usage = ledger.usage(0);
  EXPECT_EQ(usage.cores, 50u);
  EXPECT_EQ(usage.limit, 6144ull << 20);
  EXPECT_EQ(usage.rejections, 1u);
  const double seconds =
      static_cast<double>(saturated.number("end_ns") - saturated.number("begin_ns")) / 1e9;
  EXPECT_LE(static_cast<double>(usage.device_time_ns) / 1e9, 0.5 * seconds + 0.05)
      << "device time beyond a 50 % share";
  // The operator sees its limit on the GPU the scheduler chose for it (FGD picks the GPU by
  // the pods waiting and held, so either may be chosen), which is the GPU it got.
  const nlohmann::json assignment =
      nlohmann::json::parse(cluster.get("pods", "default/slice-2")
                                ->at("metadata")
                                .at("annotations")
                                .value(contract::kAssignmentAnnotation, std::string("{}")));
  ASSERT_EQ(assignment.value("gpus", nlohmann::json::array()).size(), 1u) << assignment.dump();
  const int gpu = assignment["gpus"][0].get<int>();
  EXPECT_EQ(container.envs.at(contract::kVisibleDevicesVariable), simulated_gpu_uuid(gpu));
  EXPECT_EQ(node.metric("tessera_container_memory_limit_bytes{namespace=\"default\",pod=\"slice-"
                        "2\",container=\"main\",gpu=\"" +
                        std::to_string(gpu) + "\",UUID=\"" + simulated_gpu_uuid(gpu) +
                        "\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node\"}"),
            static_cast<double>(6144ull << 20))
      << node.metrics();
}

// One rule numbers a node's GPUs for the scheduler, on both sides: on a node whose GPUs are
// time-sliced (0), cut into MIG devices (1), sliced (2) and whole (3) in one config, the GPU
// tessera scheduler chooses is the GPU the container gets, whether the pod's record names it by
// UUID or only by the scheduler's number.
TEST(Node, OnAMixedNodeTheSchedulersGpuIsTheGpuTheContainerGets) {
  ScratchDirectory scratch;
  const Environment env =
      machine(scratch, "A100-80GB;A100-80GB;A100-80GB;A100-80GB", {{"TESSERA_SIMULATE", "1"}});
  const std::string layout = scratch.file("mig.yaml");
  write_config(layout,
               "version: v1\nmig-configs:\n  gpu1:\n    - devices: [1]\n"
               "      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n");
  const std::vector<std::string> apply = {tessera(), "mig", "apply", "-f", layout, "-c", "gpu1"};
  ASSERT_EQ(run(apply, env).exit_code, 3);  // MIG on waits for a reset
  ASSERT_EQ(run({tessera(), "simgpu", "reset", "--device", "1"}, env).exit_code, 0);
  ASSERT_EQ(run(apply, env).exit_code, 0);
  const std::string config = scratch.file("config.yaml");
  write_config(config,
               "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n"
               "    resources:\n    - name: nvidia.com/gpu\n      rename: gpu-shared\n"
               "      devices: [0]\n      replicas: 2\n  slices:\n    resources:\n"
               "    - name: nvidia.com/gpu\n      devices: [2]\n      replicas: 4\n");
  FakeCluster cluster;
  cluster.put("nodes", cluster_node("gpu-node"));
  TestKubelet kubelet(scratch.file("dp"));
  NodeProcess node(scratch, {"--config-file", config, "--api-server", cluster.url()}, env);
  ASSERT_TRUE(node.started()) << node.log();
  ASSERT_TRUE(cluster.wait_for(
      "nodes", "gpu-node",
      [](const nlohmann::json& object) {
        return object["metadata"]["annotations"].contains(contract::kGpusAnnotation);
      },
      10s));
  ASSERT_TRUE(kubelet.wait_for_devices(
      "nvidia.com/gpu", [](const TestKubelet::Devices& devices) { return devices.size() == 5; },
      10s))
      << "four slices of GPU 2 and GPU 3 whole\n"
      << node.log();
  const nlohmann::json gpus = nlohmann::json::parse(cluster.get("nodes", "gpu-node")
                                                        ->at("metadata")
                                                        .at("annotations")
                                                        .at(contract::kGpusAnnotation)
                                                        .get<std::string>());
  std::vector<std::string> sharing;
  for (const auto& gpu : gpus["gpus"]) sharing.push_back(gpu["sharing"]);
  EXPECT_EQ(sharing, (std::vector<std::string>{"timeslice", "mig", "slices", "none"}));

  SchedulerProcess scheduler(cluster, env);
  // A slice, then a whole GPU (GPU 2 holds a slice now: GPU 3), each placed and admitted; the
  // whole GPU's record names it by number alone, as an older scheduler wrote it.
  const std::vector<std::pair<nlohmann::json, int>> pods = {{gpu_pod("slice", 1, 10240, 20), 2},
                                                            {gpu_pod("whole", 1), 3}};
  for (const auto& [object, expected] : pods) {
    const std::string name = object["metadata"]["name"];
    cluster.put("pods", object);
    std::string why;
    ASSERT_EQ(scheduler.schedule(*cluster.get("pods", "default/" + name), {"gpu-node"}, why),
              "gpu-node")
        << why;
    nlohmann::json pod = *cluster.get("pods", "default/" + name);
    kube::RecordedAssignment record = kube::assignment_from_annotation(
        pod["metadata"]["annotations"][contract::kAssignmentAnnotation]);
    ASSERT_EQ(record.gpus.size(), 1u);
    const std::vector<std::string> numbering = contract::scheduler_numbering(gpus["gpus"]);
    ASSERT_EQ(numbering.at(static_cast<std::size_t>(record.gpus[0])), simulated_gpu_uuid(expected))
        << "the scheduler's choice for " << name;
    if (name == "whole") {
      record.uuids.clear();
      cluster.patch(
          "pods", "default/" + name,
          {{"metadata",
            {{"annotations",
              {{contract::kAssignmentAnnotation, kube::assignment_annotation(record)}}}}}});
      pod = *cluster.get("pods", "default/" + name);
    }
    std::vector<TestKubelet::AdmittedContainer> admitted;
    ASSERT_TRUE(kubelet.admit(kubelet_pod(pod), admitted).ok()) << node.log();
    ASSERT_TRUE(kubelet.start("default", name, "main").ok()) << node.log();
    EXPECT_EQ(container_spec(admitted.front()).envs.at(contract::kVisibleDevicesVariable),
              simulated_gpu_uuid(expected))
        << name << ": the container's GPU is the scheduler's";
  }
  // The kubelet's own pods: a MIG device and a time-sliced replica, on GPUs 1 and 0.
  nlohmann::json mig = gpu_pod("mig", 0);
  mig["spec"]["containers"][0]["resources"]["limits"] = {{"nvidia.com/mig-1g.10gb", 1}};
  nlohmann::json shared = gpu_pod("shared", 0);
  shared["spec"]["containers"][0]["resources"]["limits"] = {{"nvidia.com/gpu-shared", 1}};
  for (const auto& [object, uuid_prefix] :
       {std::pair{mig, std::string("MIG-")}, std::pair{shared, simulated_gpu_uuid(0)}}) {
    std::vector<TestKubelet::AdmittedContainer> admitted;
    ASSERT_TRUE(kubelet.admit(kubelet_pod(object), admitted).ok()) << node.log();
    EXPECT_EQ(container_spec(admitted.front())
                  .envs.at(contract::kVisibleDevicesVariable)
                  .rfind(uuid_prefix, 0),
              0u);
  }
  EXPECT_EQ(node.log().find("where the scheduler assigned others"), std::string::npos)
      << "no container got another GPU than its scheduler's";
}

}  // namespace
}  // namespace tessera::test
