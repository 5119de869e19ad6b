// tessera node --dra as the kubelet and the API server meet it: registration through the
// plugins registry, ResourceSlices published through the fake API server and kept current with
// the GPUs' health, and claims prepared over real gRPC into CDI specs that an emulated
// container applies, across a kill -9 of the agent.
// Tessera's lock annotations before gRPC's Abseil, which defines the same names unguarded.
#include "node_process.h"
// Then the rest.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "contract/dra.h"
#include "contract/host_layout.h"
#include "contract/layout.h"
#include "contract/variables.h"
#include "device_record.h"
#include "dra/cdi.h"
#include "dra_kubelet.h"
#include "fake_cluster.h"
#include "node/container_grants.h"
#include "support.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;
namespace dra_v1 = k8s::io::kubelet::pkg::apis::dra::v1;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kNode = "gpu-node";

// The agent with --dra on a private simulated machine, its kubelet directories in `scratch`.
std::vector<std::string> dra_flags(const ScratchDirectory& scratch, const FakeCluster& cluster) {
  return {"--dra",
          "--api-server",
          cluster.url(),
          "--plugins-registry-dir",
          scratch.file("plugins_registry"),
          "--plugins-dir",
          scratch.file("plugins"),
          "--cdi-dir",
          scratch.file("cdi")};
}

json claim_object(const std::string& uid, const std::string& name, const json& results,
                  const json& config = json::array()) {
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceClaim"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"uid", uid}}},
          {"status", {{"allocation", {{"devices", {{"results", results}, {"config", config}}}}}}}};
}

json shared_result(const std::string& device, const std::string& memory, const std::string& cores) {
  return {{"request", "gpu"},
          {"driver", contract::kDraDriverName},
          {"pool", kNode},
          {"device", device},
          {"consumedCapacity", {{"memory", memory}, {"cores", cores}}}};
}

json priority_config(const std::string& priority, const std::string& strategy = "Limits") {
  return json::array({{{"source", "FromClaim"},
                       {"opaque",
                        {{"driver", contract::kDraDriverName},
                         {"parameters",
                          {{"apiVersion", contract::kDraConfigApiVersion},
                           {"kind", contract::kDraConfigKind},
                           {"strategy", strategy},
                           {"priority", priority}}}}}}});
}

// Every device the node's pool publishes, by name, as a consumer reads it: only the slices of
// the newest generation, and only once all of them (its resourceSliceCount) are there; an empty
// map while the pool is being rewritten.
std::map<std::string, json> published(const FakeCluster& cluster,
                                      std::int64_t* generation = nullptr,
                                      json* counters = nullptr) {
  const auto listed =
      cluster.list_resource_slices(contract::kDraDriverName, kNode, kube::Deadline::max());
  std::int64_t newest = 0;
  const json items = json::parse(listed.body)["items"];
  for (const json& slice : items) {
    newest = std::max<std::int64_t>(newest, slice["spec"]["pool"]["generation"]);
  }
  std::map<std::string, json> devices;
  std::size_t slices = 0, expected = 0;
  for (const json& slice : items) {
    if (slice["spec"]["pool"]["generation"] != newest) continue;
    ++slices;
    expected = slice["spec"]["pool"]["resourceSliceCount"];
    for (const json& device : slice["spec"].value("devices", json::array())) {
      devices[device["name"]] = device;
    }
    if (counters != nullptr && slice["spec"].contains("sharedCounters")) {
      *counters = slice["spec"]["sharedCounters"];
    }
  }
  if (slices == 0 || slices != expected) return {};
  if (generation != nullptr) *generation = newest;
  return devices;
}

bool wait_until(const std::function<bool()>& ready, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!ready()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// The container a runtime makes from a claim's CDI devices: the spec's edits and the named
// devices' (the simulated GPU needs no device node, so the nodes are only checked).
ContainerSpec apply_cdi(const std::string& spec_path, const std::vector<std::string>& ids) {
  const json spec = json::parse(read_text_file(spec_path));
  ContainerSpec container;
  for (const json& entry : spec["containerEdits"]["env"]) {
    const std::string text = entry;
    container.envs[text.substr(0, text.find('='))] = text.substr(text.find('=') + 1);
  }
  for (const json& mount : spec["containerEdits"]["mounts"]) {
    const bool read_only = mount["options"][0] == "ro";
    container.mounts.push_back({mount["containerPath"], mount["hostPath"], read_only});
  }
  for (const std::string& id : ids) {
    const std::string name = id.substr(id.find('=') + 1);
    bool found = false;
    for (const json& device : spec["devices"]) {
      if (device["name"] == name) {
        found = true;
        EXPECT_FALSE(device["containerEdits"]["deviceNodes"].empty()) << name;
      }
    }
    EXPECT_TRUE(found) << id << " is not in " << spec_path;
  }
  return container;
}

class DraNode : public ::testing::Test {
 protected:
  DraNode() { cluster_.put("nodes", cluster_node(kNode)); }
  ScratchDirectory scratch_;
  FakeCluster cluster_;
  DraKubelet kubelet_{scratch_.file("plugins_registry")};
};

TEST_F(DraNode, RegistersAndPublishesSlicesThatMatchTheSimulatedNode) {
  NodeProcess node(scratch_, dra_flags(scratch_, cluster_), machine(scratch_), kNode);
  ASSERT_TRUE(node.started()) << node.log();
  std::string why;
  ASSERT_TRUE(kubelet_.register_plugin(contract::kDraDriverName, 10s, why)) << why << node.log();
  EXPECT_EQ(kubelet_.info().endpoint(), scratch_.file("plugins") + "/gpu.tessera.io/dra.sock");
  EXPECT_EQ(kubelet_.info().supported_versions_size(), 2);
  ASSERT_TRUE(wait_until([&] { return !published(cluster_).empty(); }, 10s)) << node.log();

  json counters;
  const auto devices = published(cluster_, nullptr, &counters);
  for (int gpu = 0; gpu < 2; ++gpu) {
    const json& whole = devices.at("gpu-" + std::to_string(gpu));
    EXPECT_EQ(whole["attributes"]["uuid"]["string"], simulated_gpu_uuid(gpu));
    EXPECT_EQ(whole["attributes"]["productName"]["string"], "NVIDIA H100 80GB HBM3");
    EXPECT_TRUE(devices.at("gpu-" + std::to_string(gpu) + "-shared")["allowMultipleAllocations"]);
    EXPECT_TRUE(devices.contains("gpu-" + std::to_string(gpu) + "-7g-80gb-0"));
  }
  ASSERT_EQ(counters.size(), 2u);
  EXPECT_TRUE(counters[1]["counters"].contains("memory-slice-7"));
  // One node, one way of handing out its GPUs: no device plugin registers beside the driver.
  EXPECT_FALSE(fs::exists(scratch_.file("dp/tessera-gpu.sock")));
}

// The node's config states what a shared claim that names no amount consumes; an edit of the
// config reaches the slices at a new generation, without a restart.
TEST_F(DraNode, AConfigChangeRewritesTheSlicesDefaults) {
  const std::string config = scratch_.file("config.yaml");
  auto slices_config = [](const std::string& memory, int cores) {
    return "version: v1\nsharing:\n  slices:\n    resources:\n    - name: nvidia.com/gpu\n"
           "      replicas: 4\n      memoryPerSlice: " +
           memory + "\n      coresPerSlice: " + std::to_string(cores) + "\n";
  };
  write_config(config, slices_config("16GiB", 25));
  auto flags = dra_flags(scratch_, cluster_);
  flags.insert(flags.end(), {"--config-file", config});
  NodeProcess node(scratch_, flags, machine(scratch_), kNode);
  ASSERT_TRUE(node.started()) << node.log();
  auto defaults = [&] {
    const auto devices = published(cluster_);
    if (!devices.contains("gpu-1-shared")) return std::string();
    const json& capacity = devices.at("gpu-1-shared")["capacity"];
    return capacity["memory"]["requestPolicy"]["default"].get<std::string>() + " " +
           capacity["cores"]["requestPolicy"]["default"].get<std::string>();
  };
  ASSERT_TRUE(wait_until([&] { return defaults() == "16384Mi 25"; }, 10s))
      << defaults() << node.log();
  std::int64_t before = 0;
  published(cluster_, &before);
  write_config(config, slices_config("8GiB", 50));
  ASSERT_TRUE(wait_until([&] { return defaults() == "8192Mi 50"; }, 10s))
      << defaults() << node.log();
  std::int64_t after = 0;
  published(cluster_, &after);
  EXPECT_GT(after, before);
}

TEST_F(DraNode, AnXidTaintsTheGpusDevicesWithinASecondAndRecoveryRemovesTheTaint) {
  const Environment env = machine(scratch_);
  NodeProcess node(
      scratch_,
      [&] {
        auto flags = dra_flags(scratch_, cluster_);
        flags.insert(flags.end(), {"--recovery-period", "2"});
        return flags;
      }(),
      env, kNode);
  ASSERT_TRUE(node.started()) << node.log();
  std::int64_t first = 0;
  ASSERT_TRUE(wait_until([&] { return !published(cluster_, &first).empty(); }, 10s));
  auto tainted = [&] {
    const auto devices = published(cluster_);
    return devices.count("gpu-1") > 0 && devices.at("gpu-1").contains("taints") &&
           !devices.at("gpu-0").contains("taints");
  };
  const auto raised = Clock::now();
  const Finished event = run({tessera(), "simgpu", "event", "--device", "1", "--xid", "79"}, env);
  ASSERT_EQ(event.exit_code, 0) << event.err;
  ASSERT_TRUE(wait_until(tainted, 1s)) << node.log();
  EXPECT_LT(Clock::now() - raised, 1s);
  std::int64_t tainted_generation = 0;
  const auto devices = published(cluster_, &tainted_generation);
  ASSERT_TRUE(devices.contains("gpu-1-shared"));
  EXPECT_EQ(devices.at("gpu-1-shared")["taints"][0]["effect"], "NoSchedule");
  EXPECT_GT(tainted_generation, first);
  ASSERT_TRUE(wait_until(
      [&] {
        const auto now = published(cluster_);
        return now.contains("gpu-1") && !now.at("gpu-1").contains("taints");
      },
      10s))
      << node.log();
  EXPECT_GE(Clock::now() - raised, 2s);
}

TEST_F(DraNode, ASharedClaimRunsHeldToItsLimitsAndUnprepareCleansUpAfterAKill9) {
  const Environment env = machine(scratch_, "H100,context=0");
  auto node = std::make_unique<NodeProcess>(scratch_, dra_flags(scratch_, cluster_), env, kNode);
  ASSERT_TRUE(node->started()) << node->log();
  std::string why;
  ASSERT_TRUE(kubelet_.register_plugin(contract::kDraDriverName, 10s, why)) << why;
  const std::string uid = "a1b2c3d4-0000-4000-8000-000000000001";
  cluster_.put(
      "resourceclaims",
      claim_object(uid, "inference", json::array({shared_result("gpu-0-shared", "4Gi", "30")}),
                   priority_config("high")));
  const DraKubelet::Claim claim{"default", uid, "inference"};
  dra_v1::NodePrepareResourcesResponse prepared;
  ASSERT_TRUE(kubelet_.prepare({claim}, prepared).ok());
  const auto& answer = prepared.claims().at(uid);
  ASSERT_EQ(answer.error(), "") << node->log();
  ASSERT_EQ(answer.devices_size(), 1);
  EXPECT_EQ(answer.devices(0).pool_name(), kNode);
  EXPECT_EQ(answer.devices(0).device_name(), "gpu-0-shared");
  const std::string spec_path = dra::cdi_spec_path(scratch_.file("cdi"), uid);
  const ContainerSpec container = apply_cdi(spec_path, {answer.devices(0).cdi_device_ids().begin(),
                                                        answer.devices(0).cdi_device_ids().end()});

  // In the container: the claim's 4 GiB and not a byte more, whatever it asks.
  const Finished filled =
      run(in_container(scratch_, container, {worker(), "fill", std::to_string(64ull << 20)}), env);
  ASSERT_EQ(filled.exit_code, 0) << filled.err;
  EXPECT_EQ(filled.number("total"), 4ull << 30);
  EXPECT_LE(filled.number("allocated") + filled.number("driver_used"), 4ull << 30);

  // kill -9 between Prepare and Unprepare; a new agent answers the retry identically and
  // Unprepare removes everything Prepare made.
  node->kill_hard();
  node = std::make_unique<NodeProcess>(scratch_, dra_flags(scratch_, cluster_), env, kNode);
  ASSERT_TRUE(node->started()) << node->log();
  ASSERT_TRUE(kubelet_.register_plugin(contract::kDraDriverName, 10s, why)) << why;
  dra_v1::NodePrepareResourcesResponse again;
  ASSERT_TRUE(kubelet_.prepare({claim}, again).ok());
  EXPECT_EQ(again.claims().at(uid).SerializeAsString(), answer.SerializeAsString());
  dra_v1::NodeUnprepareResourcesResponse unprepared;
  ASSERT_TRUE(kubelet_.unprepare({claim}, unprepared).ok());
  EXPECT_EQ(unprepared.claims().at(uid).error(), "");
  EXPECT_FALSE(fs::exists(spec_path));
  EXPECT_FALSE(fs::exists(
      contract::StateLayout(scratch_.file("state")).container(node::claim_container_id(uid))));
  EXPECT_FALSE(fs::exists(scratch_.file("state/dra/claims/" + uid + ".json")));
  ASSERT_TRUE(kubelet_.unprepare({claim}, unprepared).ok());
  EXPECT_EQ(unprepared.claims().at(uid).error(), "");
}

TEST_F(DraNode, EveryClaimOfARequestGetsItsOwnAnswerAndHostileOnesHarmNoOther) {
  NodeProcess node(scratch_, dra_flags(scratch_, cluster_), machine(scratch_), kNode);
  ASSERT_TRUE(node.started()) << node.log();
  std::string why;
  ASSERT_TRUE(kubelet_.register_plugin(contract::kDraDriverName, 10s, why)) << why;
  const std::string good = "a1b2c3d4-0000-4000-8000-000000000010";
  const std::string bad_config = "a1b2c3d4-0000-4000-8000-000000000011";
  const std::string unknown = "a1b2c3d4-0000-4000-8000-000000000012";
  cluster_.put(
      "resourceclaims",
      claim_object(good, "good", json::array({shared_result("gpu-1-shared", "2Gi", "20")})));
  cluster_.put("resourceclaims",
               claim_object(bad_config, "bad-config",
                            json::array({shared_result("gpu-1-shared", "2Gi", "20")}),
                            priority_config("urgent")));
  cluster_.put("resourceclaims",
               claim_object(unknown, "unknown", json::array({shared_result("gpu-7", "1Gi", "1")})));
  dra_v1::NodePrepareResourcesResponse answer;
  ASSERT_TRUE(kubelet_
                  .prepare({{"default", bad_config, "bad-config"},
                            {"default", good, "good"},
                            {"default", unknown, "unknown"},
                            {"default", "not/a/uid", "x"},
                            {"default", "a1b2c3d4-0000-4000-8000-000000000099", "absent"}},
                           answer)
                  .ok());
  ASSERT_EQ(answer.claims_size(), 5);
  EXPECT_EQ(answer.claims().at(good).error(), "");
  EXPECT_EQ(answer.claims().at(good).devices_size(), 1);
  EXPECT_NE(answer.claims().at(bad_config).error().find("priority: 'urgent'"), std::string::npos);
  EXPECT_NE(answer.claims().at(unknown).error().find("'gpu-7' is not one this node publishes"),
            std::string::npos);
  EXPECT_NE(answer.claims().at("not/a/uid").error().find("is not a UID"), std::string::npos);
  EXPECT_NE(answer.claims().at("a1b2c3d4-0000-4000-8000-000000000099").error().find("HTTP 404"),
            std::string::npos);
  EXPECT_EQ(node.metric("tessera_dra_prepare_calls_total{result=\"refused\"}"), 4);
  EXPECT_EQ(node.metric("tessera_dra_prepared_claims"), 1);
  EXPECT_EQ(node.metric("tessera_dra_registered"), 1);
  // v1beta1 answers alike.
  k8s::io::kubelet::pkg::apis::dra::v1beta1::NodePrepareResourcesResponse beta;
  ASSERT_TRUE(kubelet_.prepare_v1beta1({{"default", good, "good"}}, beta).ok());
  EXPECT_EQ(beta.claims().at(good).devices(0).device_name(), "gpu-1-shared");
}

// Two claims sharing one GPU meet in its coordination file as pods do: time-sliced (no compute
// cap, so only priority keeps them apart), a high-priority claim's
// interactive client (1 ms kernels, each awaited, then 1 ms idle) stays within a tenth of its
// latency alone beside a low-priority claim saturating the GPU with 1 ms kernels. Medians of
// three rounds that alternate alone and beside; latencies from the device's own record.
TEST_F(DraNode, TwoClaimsOnAGpuCoordinateByPriority) {
  const char* devices = "H100,context=0";
  const Environment env = machine(scratch_, devices);
  NodeProcess node(scratch_, dra_flags(scratch_, cluster_), env, kNode);
  ASSERT_TRUE(node.started()) << node.log();
  std::string why;
  ASSERT_TRUE(kubelet_.register_plugin(contract::kDraDriverName, 10s, why)) << why;
  auto prepared_container = [&](const std::string& uid, const std::string& name,
                                const std::string& priority) {
    cluster_.put("resourceclaims",
                 claim_object(uid, name, json::array({shared_result("gpu-0-shared", "8Gi", "50")}),
                              priority_config(priority, "TimeSlicing")));
    dra_v1::NodePrepareResourcesResponse answer;
    EXPECT_TRUE(kubelet_.prepare({{"default", uid, name}}, answer).ok());
    const auto& claim = answer.claims().at(uid);
    EXPECT_EQ(claim.error(), "");
    return apply_cdi(
        dra::cdi_spec_path(scratch_.file("cdi"), uid),
        {claim.devices(0).cdi_device_ids().begin(), claim.devices(0).cdi_device_ids().end()});
  };
  const ContainerSpec interactive =
      prepared_container("a1b2c3d4-0000-4000-8000-000000000020", "interactive", "high");
  const ContainerSpec batch =
      prepared_container("a1b2c3d4-0000-4000-8000-000000000021", "batch", "low");
  auto client = [&] {
    Finished done = run(
        in_container(scratch_, interactive, {worker(), "latency", "hi@1ms", "300", "1000"}), env);
    EXPECT_EQ(done.exit_code, 0) << done.err;
    return done;
  };
  constexpr std::uint64_t kSettleNs = 100'000'000;
  std::vector<std::uint64_t> alone_p90, beside_p90;
  for (int round = 0; round < 3; ++round) {
    const auto alone = completion_latencies(scratch_, client(), kSettleNs, 0, devices);
    Running saturating(
        in_container(scratch_, batch, {worker(), "saturate", "plain", "lo@1ms", "2.0"}), env);
    ASSERT_EQ(saturating.read_line(), "started");
    const auto beside = completion_latencies(scratch_, client(), kSettleNs, 0, devices);
    ASSERT_EQ(saturating.finish().exit_code, 0);
    ASSERT_GE(alone.size(), 200u);
    ASSERT_GE(beside.size(), 200u);
    alone_p90.push_back(percentile(alone, 90));
    beside_p90.push_back(percentile(beside, 90));
  }
  std::sort(alone_p90.begin(), alone_p90.end());
  std::sort(beside_p90.begin(), beside_p90.end());
  std::printf("p90 alone %.0f us, beside a low-priority claim %.0f us\n", alone_p90[1] / 1e3,
              beside_p90[1] / 1e3);
  EXPECT_LE(static_cast<double>(beside_p90[1]), 1.1 * static_cast<double>(alone_p90[1]));
}

// A node hands out its GPUs one way: an agent that would serve device plugins beside the DRA
// driver is refused, and so is a DRA driver beside a serving device plugin.
TEST_F(DraNode, DevicePluginsAndTheDraDriverAreRefusedBesideEachOther) {
  const Environment env = machine(scratch_);
  // DRA reads claims from the API server: without one, --dra is a usage error.
  const Finished alone = run({tessera(), "node", "--dra", "--node-name", kNode}, env);
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_NE(alone.err.find("--dra reads claims"), std::string::npos) << alone.err;
  auto node = std::make_unique<NodeProcess>(scratch_, dra_flags(scratch_, cluster_), env, kNode);
  ASSERT_TRUE(node->started()) << node->log();
  const Finished beside = run({tessera(), "node", "--node-name", kNode, "--device-plugin-dir",
                               scratch_.file("dp"), "--state-dir", scratch_.file("state"),
                               "--plugins-registry-dir", scratch_.file("plugins_registry")},
                              env);
  EXPECT_NE(beside.exit_code, 0);
  EXPECT_NE(beside.err.find("Tessera's DRA driver serves this node's GPUs"), std::string::npos)
      << beside.err;
  EXPECT_EQ(node->stop(), 0);

  // The other way round: a device-plugin agent serving, then --dra.
  TestKubelet device_kubelet(scratch_.file("dp"));
  NodeProcess plugins(scratch_, {}, env, kNode);
  ASSERT_TRUE(plugins.started()) << plugins.log();
  ASSERT_TRUE(device_kubelet.wait_for_registration("nvidia.com/gpu", Clock::time_point{}, 10s));
  std::vector<std::string> argv = {
      tessera(),           "node",        "--node-name",          kNode, "--device-plugin-dir",
      scratch_.file("dp"), "--state-dir", scratch_.file("state2")};
  for (const std::string& flag : dra_flags(scratch_, cluster_)) argv.push_back(flag);
  const Finished dra = run(argv, env);
  EXPECT_NE(dra.exit_code, 0);
  EXPECT_NE(dra.err.find("a Tessera device plugin serves this node's GPUs"), std::string::npos)
      << dra.err;
}

}  // namespace
}  // namespace tessera::test
