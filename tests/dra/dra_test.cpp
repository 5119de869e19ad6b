// The DRA driver's decisions in process: the opaque config, the claim reader, the pool's
// slices, and Prepare/Unprepare against the API server held in memory.
#include "contract/dra.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/limits.h"
#include "dra/cdi.h"
#include "dra/claim.h"
#include "dra/driver.h"
#include "dra/pool.h"
#include "dra/sharing_config.h"
#include "dra/slice_publisher.h"
#include "kube/quantity.h"
#include "ledger/ledger.h"
#include "memory_cluster.h"
#include "node_fixtures.h"
#include "yaml_json.h"

namespace tessera::test {
namespace {

using dra::ClaimError;
using dra::DraConfigError;
using dra::SharingConfig;
using nlohmann::json;

constexpr const char* kH100 = "NVIDIA H100 80GB HBM3";

// The error `parse` throws, or "" when it accepts.
template <typename Error, typename Call>
std::string refusal(Call call) {
  try {
    call();
  } catch (const Error& refused) {
    return refused.what();
  }
  return "";
}

std::string config_refusal(const std::string& yaml_json) {
  return refusal<DraConfigError>([&] { dra::parse_sharing_config(json::parse(yaml_json)); });
}

// --- the opaque config ---------------------------------------------------------------------

TEST(DraConfig, TesserasOwnConfigIsReadWhole) {
  const SharingConfig config = dra::parse_sharing_config(json::parse(R"({
    "apiVersion": "gpu.tessera.io/v1alpha1", "kind": "GpuSharing",
    "strategy": "Limits", "priority": "high", "burst": true})"));
  EXPECT_EQ(config.strategy, SharingConfig::Strategy::limits);
  EXPECT_EQ(config.priority, Priority::high);
  EXPECT_TRUE(config.burst);

  const SharingConfig mps = dra::parse_sharing_config(json::parse(R"({
    "apiVersion": "gpu.tessera.io/v1alpha1", "kind": "GpuSharing", "strategy": "MPS",
    "mps": {"activeThreadPercentage": 40, "pinnedMemoryLimit": "10Gi"}})"));
  EXPECT_EQ(mps.mps_thread_percentage, 40);
  EXPECT_EQ(mps.mps_pinned_memory_bytes, 10ull << 30);

  const SharingConfig sliced = dra::parse_sharing_config(json::parse(R"({
    "apiVersion": "gpu.tessera.io/v1alpha1", "kind": "GpuSharing", "strategy": "TimeSlicing",
    "timeSlicing": {"interval": "Long"}})"));
  EXPECT_EQ(sliced.interval, "Long");
}

TEST(DraConfig, NvidiasGpuConfigMeansTheSameSharing) {
  const SharingConfig time_slicing = dra::parse_sharing_config(json::parse(R"({
    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}})"));
  EXPECT_EQ(time_slicing.strategy, SharingConfig::Strategy::time_slicing);
  EXPECT_EQ(time_slicing.interval, "Short");
  const SharingConfig mps = dra::parse_sharing_config(json::parse(R"({
    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "4Gi"}}})"));
  EXPECT_EQ(mps.strategy, SharingConfig::Strategy::mps);
  EXPECT_EQ(mps.mps_thread_percentage, 50);
  EXPECT_EQ(mps.mps_pinned_memory_bytes, 4ull << 30);
  const SharingConfig whole = dra::parse_sharing_config(
      json::parse(R"({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"})"));
  EXPECT_EQ(whole, SharingConfig());
}

TEST(DraConfig, BadConfigsAreRefusedNamingTheField) {
  const std::string tessera = R"("apiVersion": "gpu.tessera.io/v1alpha1", "kind": "GpuSharing")";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{" + tessera + R"(, "priorty": "high"})", "priorty: unknown field"},
      {"{" + tessera + R"(, "priority": "urgent"})", "priority: 'urgent'"},
      {"{" + tessera + R"(, "priority": 1})", "priority: must be a string"},
      {"{" + tessera + R"(, "burst": "yes"})", "burst: must be true or false"},
      {"{" + tessera + R"(, "strategy": "MPS", "timeSlicing": {}})",
       "timeSlicing: is given with strategy MPS"},
      {"{" + tessera + R"(, "mps": {"activeThreadPercentage": 50}})",
       "mps: is given with strategy Limits"},
      {"{" + tessera + R"(, "strategy": "MPS", "burst": true})", "burst: bursting"},
      {"{" + tessera + R"(, "strategy": "MPS", "mps": {"activeThreadPercentage": 101}})",
       "mps.activeThreadPercentage: must be a whole number from 1 to 100"},
      {"{" + tessera + R"(, "strategy": "MPS", "mps": {"pinnedMemoryLimit": "lots"}})",
       "mps.pinnedMemoryLimit: must be a memory quantity"},
      {"{" + tessera + R"(, "strategy": "TimeSlicing", "timeSlicing": {"interval": "Forever"}})",
       "timeSlicing.interval: 'Forever'"},
      {R"({"kind": "GpuSharing"})", "apiVersion: is required"},
      {R"({"apiVersion": "gpu.tessera.io/v2", "kind": "GpuSharing"})",
       "apiVersion: 'gpu.tessera.io/v2'"},
      {R"({"apiVersion": "gpu.tessera.io/v1alpha1", "kind": "GpuConfig"})", "kind: 'GpuConfig'"},
      {R"({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Limits"}})",
       "sharing.strategy: 'Limits'"},
      {R"({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "timeSlicingConfig": {}}})",
       "sharing.timeSlicingConfig: is given with strategy MPS"},
      {R"({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}}}})",
       "defaultPerDevicePinnedMemoryLimit: per-device limits are not supported"},
      {"[1, 2]", "parameters: must be an object"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string why = config_refusal(text);
    EXPECT_NE(why.find(expected), std::string::npos) << text << "\n -> " << why;
  }
}

// --- the claim reader ----------------------------------------------------------------------

json shared_claim(const std::string& uid, const std::string& device, const std::string& memory,
                  const std::string& cores, const json& parameters = nullptr,
                  const std::string& pool = "gpu-node") {
  json result = {
      {"request", "gpu"}, {"driver", contract::kDraDriverName}, {"pool", pool}, {"device", device}};
  if (!memory.empty()) result["consumedCapacity"]["memory"] = memory;
  if (!cores.empty()) result["consumedCapacity"]["cores"] = cores;
  json claim = {{"apiVersion", "resource.k8s.io/v1"},
                {"kind", "ResourceClaim"},
                {"metadata",
                 {{"name", "claim-" + uid.substr(uid.size() > 12 ? uid.size() - 12 : 0)},
                  {"namespace", "default"},
                  {"uid", uid}}},
                {"status", {{"allocation", {{"devices", {{"results", json::array({result})}}}}}}}};
  if (!parameters.is_null()) {
    claim["status"]["allocation"]["devices"]["config"] = json::array(
        {{{"source", "FromClaim"},
          {"requests", json::array({"gpu"})},
          {"opaque", {{"driver", contract::kDraDriverName}, {"parameters", parameters}}}}});
  }
  return claim;
}

const json kHighPriority = {
    {"apiVersion", "gpu.tessera.io/v1alpha1"}, {"kind", "GpuSharing"}, {"priority", "high"}};

dra::ClaimRef ref_of(const json& claim) {
  return {claim["metadata"]["namespace"], claim["metadata"]["uid"], claim["metadata"]["name"]};
}

TEST(DraClaim, ASharedClaimsConsumedCapacityAndConfigAreRead) {
  const json claim = shared_claim("0f0e0d0c-0000-4000-8000-000000000001", "gpu-0-shared", "4Gi",
                                  "30", kHighPriority);
  const auto devices =
      dra::read_claim_allocation(claim, ref_of(claim), contract::kDraDriverName, "gpu-node");
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].device, "gpu-0-shared");
  EXPECT_EQ(devices[0].memory_bytes, 4ull << 30);
  EXPECT_EQ(devices[0].cores, 30);
  EXPECT_EQ(devices[0].sharing.priority, Priority::high);
}

TEST(DraClaim, OtherDriversDevicesAreSkippedAndBadClaimsRefusedNamingTheField) {
  json claim = shared_claim("0f0e0d0c-0000-4000-8000-000000000002", "gpu-0", "", "");
  claim["status"]["allocation"]["devices"]["results"].push_back(
      {{"request", "nic"}, {"driver", "net.example.com"}, {"pool", "x"}, {"device", "eth0"}});
  EXPECT_EQ(
      dra::read_claim_allocation(claim, ref_of(claim), contract::kDraDriverName, "gpu-node").size(),
      1u);

  auto refused = [](const json& bad, const dra::ClaimRef& ref) {
    return refusal<ClaimError>(
        [&] { dra::read_claim_allocation(bad, ref, contract::kDraDriverName, "gpu-node"); });
  };
  const dra::ClaimRef ref = ref_of(claim);
  dra::ClaimRef other = ref;
  other.uid = "another";
  EXPECT_NE(refused(claim, other).find("metadata.uid"), std::string::npos);
  json unallocated = claim;
  unallocated["status"].erase("allocation");
  EXPECT_NE(refused(unallocated, ref).find("not allocated"), std::string::npos);
  EXPECT_NE(refused(shared_claim(ref.uid, "gpu-0", "", "", nullptr, "other-node"), ref)
                .find("results[0].pool: 'other-node' is not this node's pool"),
            std::string::npos);
  EXPECT_NE(refused(shared_claim(ref.uid, "gpu-0-shared", "four", ""), ref)
                .find("consumedCapacity.memory: 'four'"),
            std::string::npos);
  EXPECT_NE(refused(shared_claim(ref.uid, "gpu-0-shared", "", "300"), ref)
                .find("consumedCapacity.cores: '300'"),
            std::string::npos);
  json oversized = claim;
  for (int i = 0; i < 40; ++i) {
    oversized["status"]["allocation"]["devices"]["results"].push_back(
        claim["status"]["allocation"]["devices"]["results"][0]);
  }
  EXPECT_NE(refused(oversized, ref).find("at most 32"), std::string::npos);
  json bad_config = shared_claim(
      ref.uid, "gpu-0-shared", "1Gi", "10",
      {{"apiVersion", "gpu.tessera.io/v1alpha1"}, {"kind", "GpuSharing"}, {"cores", 30}});
  EXPECT_NE(refused(bad_config, ref).find("config[0].opaque.parameters.cores: unknown field"),
            std::string::npos);
  json typed = claim;
  typed["status"]["allocation"]["devices"]["results"][0]["device"] = 7;
  EXPECT_NE(refused(typed, ref).find("results[0].device"), std::string::npos);
  json none = claim;
  none["status"]["allocation"]["devices"]["results"] = json::array();
  EXPECT_NE(refused(none, ref).find("no device of gpu.tessera.io"), std::string::npos);
}

// --- the pool's slices ---------------------------------------------------------------------

std::vector<json> all_devices(const std::vector<json>& slices) {
  std::vector<json> devices;
  for (const json& slice : slices) {
    for (const json& device : slice.value("devices", json::array())) devices.push_back(device);
  }
  return devices;
}

TEST(DraPool, SlicesCarryWholeSharedAndMigDevicesAndTheCountersOfAMigCapableGpu) {
  Inventory inventory = machine(2, kH100);
  for (GpuInfo& gpu : inventory.gpus) gpu.memory_bytes = 81559ull << 20;
  give_mig_devices(inventory.gpus[1], {"3g.40gb", "1g.10gb"});
  const std::vector<json> slices = dra::pool_slices(inventory, {"", ""}, {}, "gpu-node", 7);
  ASSERT_GE(slices.size(), 2u);
  // Counter sets in a slice of their own, first; every slice says the pool's generation and
  // how many slices it has.
  ASSERT_TRUE(slices[0].contains("sharedCounters"));
  EXPECT_FALSE(slices[0].contains("devices"));
  for (const json& slice : slices) {
    EXPECT_EQ(slice["driver"], contract::kDraDriverName);
    EXPECT_EQ(slice["nodeName"], "gpu-node");
    EXPECT_EQ(slice["pool"]["generation"], 7);
    EXPECT_EQ(slice["pool"]["resourceSliceCount"], slices.size());
    EXPECT_LE(slice.value("devices", json::array()).size(), 64u);
  }
  const json& counters = slices[0]["sharedCounters"][0];
  EXPECT_EQ(counters["name"], "gpu-0-counters");
  EXPECT_EQ(counters["counters"]["memory"]["value"], "81559Mi");
  EXPECT_EQ(counters["counters"]["memory-slice-7"]["value"], "1");

  std::map<std::string, json> by_name;
  for (const json& device : all_devices(slices)) by_name[device["name"]] = device;
  // GPU 0: whole, shared and every MIG placement of the H100's catalog.
  const json& whole = by_name.at("gpu-0");
  EXPECT_EQ(whole["attributes"]["uuid"]["string"], inventory.gpus[0].uuid);
  EXPECT_EQ(whole["attributes"]["productName"]["string"], kH100);
  EXPECT_EQ(whole["attributes"]["driverVersion"]["version"], "580.65.6");
  EXPECT_EQ(whole["capacity"]["memory"]["value"], "81559Mi");
  EXPECT_EQ(whole["consumesCounters"][0]["counters"].size(), 9u);  // memory and 8 slices
  const json& shared = by_name.at("gpu-0-shared");
  EXPECT_TRUE(shared["allowMultipleAllocations"].get<bool>());
  EXPECT_EQ(shared["capacity"]["cores"]["value"], "100");
  EXPECT_EQ(shared["capacity"]["memory"]["requestPolicy"]["validRange"]["step"], "256Mi");
  std::size_t placements = 0;
  for (const mig::Profile& profile : mig::find_model(kH100)->profiles) {
    placements += profile.starts.size();
  }
  std::size_t seen = 0;
  for (const auto& [name, device] : by_name) {
    if (device["attributes"]["type"]["string"] == "mig-placement") {
      ++seen;
      EXPECT_EQ(device["attributes"]["parentUUID"]["string"], inventory.gpus[0].uuid);
    }
  }
  EXPECT_EQ(seen, placements);
  const json& one_slice = by_name.at("gpu-0-1g-10gb-6");
  EXPECT_EQ(one_slice["consumesCounters"][0]["counters"]["memory-slice-6"]["value"], "1");
  EXPECT_FALSE(one_slice["consumesCounters"][0]["counters"].contains("memory-slice-5"));
  // GPU 1, MIG on: its MIG devices only.
  EXPECT_FALSE(by_name.contains("gpu-1"));
  EXPECT_FALSE(by_name.contains("gpu-1-shared"));
  EXPECT_EQ(by_name.at("gpu-1-mig-0")["attributes"]["profile"]["string"], "3g.40gb");
  EXPECT_EQ(by_name.at("gpu-1-mig-1")["attributes"]["parentUUID"]["string"],
            inventory.gpus[1].uuid);
  EXPECT_EQ(by_name.at("gpu-1-mig-1")["capacity"]["multiprocessors"]["value"], "14");
}

// One config states a slice for both ways of handing out GPUs: a slices config's defaults are
// what a shared claim that names no amount consumes.
TEST(DraPool, TheConfigsSliceDefaultsAreTheSharedGpusRequestDefaults) {
  Inventory inventory = machine(1, kH100);
  inventory.gpus[0].memory_bytes = 81559ull << 20;
  auto shared_policy = [&](const std::string& resource_fields) {
    const PluginConfig config = parse_plugin_config(
        "version: v1\nsharing:\n  slices:\n    resources:\n    - name: nvidia.com/gpu\n" +
            resource_fields,
        "test");
    for (const json& slice :
         dra::pool_slices(inventory, {""}, dra::shared_defaults(config), "n", 1)) {
      for (const json& device : slice.value("devices", json::array())) {
        if (device["name"] == "gpu-0-shared") {
          return std::make_pair(device["capacity"]["memory"]["requestPolicy"]["default"],
                                device["capacity"]["cores"]["requestPolicy"]["default"]);
        }
      }
    }
    return std::make_pair(json(), json());
  };
  EXPECT_EQ(
      shared_policy("      replicas: 4\n      memoryPerSlice: 16GiB\n      coresPerSlice: 25\n"),
      std::make_pair(json("16384Mi"), json("25")));
  // By replicas: a quarter of 81559 MiB, down to a whole number of 256 MiB steps.
  EXPECT_EQ(shared_policy("      replicas: 4\n"), std::make_pair(json("20224Mi"), json("10")));
  EXPECT_EQ(dra::shared_defaults(default_plugin_config()), dra::SharedDefaults());
}

TEST(DraPool, AnUnhealthyGpusDevicesAreTaintedAndOnlyThose) {
  const Inventory inventory = machine(2, kH100);
  const auto slices = dra::pool_slices(inventory, {"", "XID 79: fallen off the bus"}, {}, "n", 1);
  for (const json& device : all_devices(slices)) {
    const bool on_gpu1 = device["name"].get<std::string>().starts_with("gpu-1");
    ASSERT_EQ(device.contains("taints"), on_gpu1) << device["name"];
    if (!on_gpu1) continue;
    EXPECT_EQ(device["taints"][0]["effect"], "NoSchedule");
    EXPECT_EQ(device["taints"][0]["key"], "gpu.tessera.io/unhealthy");
    EXPECT_EQ(device["taints"][0]["value"], "XID-79--fallen-off-the-bus");
  }
}

TEST(DraPool, PublishedNamesAreFoundAndNothingElse) {
  const Inventory inventory = machine(1, "Tesla T4");
  const auto devices = dra::published_devices(inventory);
  ASSERT_EQ(devices.size(), 2u);  // no MIG on a T4
  EXPECT_TRUE(dra::find_published_device(inventory, "gpu-0-shared").has_value());
  EXPECT_FALSE(dra::find_published_device(inventory, "gpu-1").has_value());
  EXPECT_FALSE(dra::find_published_device(inventory, "../gpu-0").has_value());
}

// --- publishing the slices ----------------------------------------------------------------

std::map<std::string, json> slices_in(const InMemoryCluster& cluster) {
  std::map<std::string, json> slices;
  const auto listed =
      cluster.list_resource_slices(contract::kDraDriverName, "gpu-node", kube::Deadline::max());
  const json list = json::parse(listed.body);
  for (const json& item : list["items"]) slices[item["metadata"]["name"]] = item;
  return slices;
}

TEST(DraSlices, ThePoolIsRewrittenAtANewGenerationOnlyWhenItChangesAndLeftoversGo) {
  InMemoryCluster cluster;
  const Inventory inventory = machine(2, kH100);
  // A slice left by an earlier layout of this node's pool, at generation 5.
  cluster.put("resourceslices", {{"metadata", {{"name", "gpu-node-gpu.tessera.io-9"}}},
                                 {"spec",
                                  {{"driver", contract::kDraDriverName},
                                   {"nodeName", "gpu-node"},
                                   {"pool", {{"name", "gpu-node"}, {"generation", 5}}}}}});
  dra::SlicePublisher publisher(cluster, contract::kDraDriverName, "gpu-node");
  ASSERT_TRUE(publisher.publish(inventory, {"", ""}, {}).ok());
  EXPECT_EQ(publisher.generation(), 6);  // past every generation seen
  auto slices = slices_in(cluster);
  EXPECT_FALSE(slices.contains("gpu-node-gpu.tessera.io-9"));
  ASSERT_EQ(slices.size(), dra::pool_slices(inventory, {"", ""}, {}, "gpu-node", 6).size());
  for (const auto& [name, slice] : slices) EXPECT_EQ(slice["spec"]["pool"]["generation"], 6);

  // Nothing changed: nothing written, also when asked to look again, and by a publisher that
  // starts afresh (the agent restarted) over the same pool, which takes its generation.
  const std::string version = slices.begin()->second["metadata"]["resourceVersion"];
  ASSERT_TRUE(publisher.publish(inventory, {"", ""}, {}).ok());
  publisher.recheck();
  ASSERT_TRUE(publisher.publish(inventory, {"", ""}, {}).ok());
  dra::SlicePublisher restarted(cluster, contract::kDraDriverName, "gpu-node");
  ASSERT_TRUE(restarted.publish(inventory, {"", ""}, {}).ok());
  EXPECT_EQ(restarted.generation(), 6);
  EXPECT_EQ(slices_in(cluster).begin()->second["metadata"]["resourceVersion"], version);

  // A slice deleted by someone else comes back at the next recheck, at a new generation.
  cluster.remove("resourceslices", "gpu-node-gpu.tessera.io-1");
  ASSERT_TRUE(publisher.publish(inventory, {"", ""}, {}).ok());
  EXPECT_FALSE(slices_in(cluster).contains("gpu-node-gpu.tessera.io-1"));  // not looked at yet
  publisher.recheck();
  ASSERT_TRUE(publisher.publish(inventory, {"", ""}, {}).ok());
  EXPECT_TRUE(slices_in(cluster).contains("gpu-node-gpu.tessera.io-1"));
  EXPECT_EQ(publisher.generation(), 7);

  // A GPU fails while the API server refuses writes: the failure names the slice, and the next
  // publication after it recovers writes the taint at the next generation.
  cluster.fail_writes_with(500);
  const base::Status refused = publisher.publish(inventory, {"", "XID 79"}, {});
  EXPECT_NE(refused.message().find("ResourceSlice gpu-node-gpu.tessera.io-0"), std::string::npos)
      << refused.message();
  cluster.fail_writes_with(200);
  ASSERT_TRUE(publisher.publish(inventory, {"", "XID 79"}, {}).ok());
  EXPECT_EQ(publisher.generation(), 8);
  // A publisher that starts afresh while the GPU has recovered does not take the tainted pool
  // for the one it wants.
  dra::SlicePublisher after_recovery(cluster, contract::kDraDriverName, "gpu-node");
  ASSERT_TRUE(after_recovery.publish(inventory, {"", ""}, {}).ok());
  EXPECT_EQ(after_recovery.generation(), 9);
  publisher.recheck();  // it looks, and finds its taint gone
  ASSERT_TRUE(publisher.publish(inventory, {"", "XID 79"}, {}).ok());
  bool tainted = false;
  for (const auto& [name, slice] : slices_in(cluster)) {
    EXPECT_EQ(slice["spec"]["pool"]["generation"], 10);
    for (const json& device : slice["spec"].value("devices", json::array())) {
      tainted |= device["name"] == "gpu-1" && device.contains("taints");
    }
  }
  EXPECT_TRUE(tainted);
}

// --- Prepare and Unprepare -----------------------------------------------------------------

class DraDriverTest : public ::testing::Test {
 protected:
  DraDriverTest()
      : inventory_(machine(2, kH100)),
        health_(2),
        grants_(contract::StateLayout(scratch_.file("state")), &cluster_, "gpu-node", nullptr,
                nullptr) {
    grants_.prepare(inventory_);
  }

  std::unique_ptr<dra::DraDriver> driver() {
    auto made = std::make_unique<dra::DraDriver>(
        dra::DraDriverOptions{contract::kDraDriverName, "gpu-node", scratch_.file("cdi"),
                              scratch_.file("state/dra/claims")},
        inventory_, health_, grants_, cluster_, [] { return default_plugin_config(); },
        [](const std::string&) {});
    made->restore();
    return made;
  }
  dra::ClaimRef put(const json& claim) {
    cluster_.put("resourceclaims", claim);
    return ref_of(claim);
  }
  std::string ledger_of(const std::string& uid) const {
    return contract::StateLayout(scratch_.file("state")).ledger(claim_container_id(uid));
  }
  std::vector<std::string> files_under(const std::string& directory) const {
    std::vector<std::string> files;
    std::error_code error;
    for (const auto& entry : fs::recursive_directory_iterator(directory, error)) {
      if (entry.is_regular_file()) files.push_back(entry.path().string());
    }
    return files;
  }

  ScratchDirectory scratch_;
  InMemoryCluster cluster_;
  Inventory inventory_;
  HealthBoard health_;
  ContainerGrants grants_;
};

TEST_F(DraDriverTest, ASharedClaimGetsItsExactLimitsThroughCdiAndTheSameAnswerAgain) {
  const auto driver = this->driver();
  const std::string uid = "0f0e0d0c-0000-4000-8000-000000000010";
  const dra::ClaimRef claim = put(shared_claim(uid, "gpu-1-shared", "4Gi", "30", kHighPriority));
  const dra::PrepareAnswer answer = driver->prepare(claim);
  ASSERT_EQ(answer.error, "");
  ASSERT_EQ(answer.devices.size(), 1u);
  EXPECT_EQ(answer.devices[0].device, "gpu-1-shared");
  EXPECT_EQ(answer.devices[0].cdi_device_ids,
            std::vector<std::string>{dra::cdi_device_id(uid + "-gpu-1-shared")});

  // The ledger holds the claim's own limits and priority.
  ledger::Ledger ledger;
  ErrorText error;
  ASSERT_TRUE(ledger.open(ledger_of(uid).c_str(), error)) << error.text;
  EXPECT_EQ(ledger.usage(0).limit, 4ull << 30);
  EXPECT_EQ(ledger.usage(0).cores, 30u);
  EXPECT_EQ(ledger.effective_priority(Priority::none), Priority::high);

  // The CDI spec: the hook, its preload file, the ledger and GPU 1's coordination file, the
  // variables, and GPU 1's device node.
  const json spec = json::parse(read_text_file(dra::cdi_spec_path(scratch_.file("cdi"), uid)));
  EXPECT_EQ(spec["kind"], contract::kCdiKind);
  std::set<std::string> mounted;
  for (const json& mount : spec["containerEdits"]["mounts"]) mounted.insert(mount["containerPath"]);
  EXPECT_TRUE(mounted.contains(contract::kContainerHookPath));
  EXPECT_TRUE(mounted.contains(contract::kContainerPreloadPath));
  EXPECT_TRUE(mounted.contains(contract::kContainerGroupDirectory));
  contract::DeviceKey key;
  ASSERT_TRUE(contract::device_key_from_uuid(inventory_.gpus[1].uuid.c_str(), key));
  EXPECT_TRUE(mounted.contains(contract::container_coordination_file(key)));
  const std::string env = spec["containerEdits"]["env"].dump();
  EXPECT_NE(env.find(std::string(contract::kLedgerVariable) + "="), std::string::npos);
  EXPECT_NE(
      env.find(std::string(contract::kVisibleDevicesVariable) + "=" + inventory_.gpus[1].uuid),
      std::string::npos);
  ASSERT_EQ(spec["devices"].size(), 1u);
  EXPECT_EQ(spec["devices"][0]["name"], uid + "-gpu-1-shared");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidia1");

  // The kubelet's retry, and a retry after a restart: the same answer, nothing made twice.
  const auto files = files_under(scratch_.path());
  EXPECT_EQ(driver->prepare(claim).devices, answer.devices);
  EXPECT_EQ(this->driver()->prepare(claim).devices, answer.devices);
  EXPECT_EQ(files_under(scratch_.path()), files);
}

TEST_F(DraDriverTest, UnprepareAfterARestartRemovesEverythingAndIsIdempotent) {
  const std::string uid = "0f0e0d0c-0000-4000-8000-000000000011";
  const dra::ClaimRef claim = put(shared_claim(uid, "gpu-0-shared", "2Gi", "20"));
  const auto before = files_under(scratch_.path());
  ASSERT_EQ(driver()->prepare(claim).error, "");
  EXPECT_GT(files_under(scratch_.path()).size(), before.size());
  // A new driver: what the old one prepared is known from its checkpoint.
  const auto restarted = driver();
  EXPECT_EQ(restarted->prepared(), 1u);
  EXPECT_EQ(restarted->unprepare(claim), "");
  EXPECT_EQ(files_under(scratch_.path()), before);
  EXPECT_EQ(restarted->prepared(), 0u);
  EXPECT_EQ(restarted->unprepare(claim), "");  // again: nothing to do, no error
}

// A checkpoint written over (a full disk, a person's edit) is skipped with a word, not trusted;
// Unprepare of its claim still removes everything, since all of it is named by the UID.
TEST_F(DraDriverTest, AnUnreadableCheckpointIsSkippedAndUnprepareStillCleansUp) {
  const std::string uid = "0f0e0d0c-0000-4000-8000-000000000012";
  const dra::ClaimRef claim = put(shared_claim(uid, "gpu-0-shared", "2Gi", "20"));
  const auto before = files_under(scratch_.path());
  ASSERT_EQ(driver()->prepare(claim).error, "");
  for (const std::string& garbage : {std::string("{\"claim\": 7}"),
                                     std::string("\x01\x02 not json"), std::string(2 << 20, '[')}) {
    std::ofstream(scratch_.file("state/dra/claims/" + uid + ".json"), std::ios::trunc) << garbage;
    std::vector<std::string> said;
    dra::DraDriver restarted(
        {contract::kDraDriverName, "gpu-node", scratch_.file("cdi"),
         scratch_.file("state/dra/claims")},
        inventory_, health_, grants_, cluster_, [] { return default_plugin_config(); },
        [&](const std::string& text) { said.push_back(text); });
    restarted.restore();
    EXPECT_EQ(restarted.prepared(), 0u);
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find("is not readable and is skipped"), std::string::npos) << said[0];
  }
  EXPECT_EQ(driver()->unprepare(claim), "");
  EXPECT_EQ(files_under(scratch_.path()), before);
}

TEST_F(DraDriverTest, ConflictingClaimsAreRefusedAndSharedGpusNeverOverbooked) {
  const auto driver = this->driver();
  const dra::ClaimRef whole =
      put(shared_claim("0f0e0d0c-0000-4000-8000-000000000020", "gpu-0", "", ""));
  ASSERT_EQ(driver->prepare(whole).error, "");
  // The whole GPU 0 is taken: neither it nor a share of it goes to another claim.
  const dra::ClaimRef again =
      put(shared_claim("0f0e0d0c-0000-4000-8000-000000000021", "gpu-0", "", ""));
  EXPECT_NE(driver->prepare(again).error.find("conflicts with 'gpu-0'"), std::string::npos);
  const dra::ClaimRef share =
      put(shared_claim("0f0e0d0c-0000-4000-8000-000000000022", "gpu-0-shared", "1Gi", "10"));
  EXPECT_NE(driver->prepare(share).error.find("conflicts"), std::string::npos);
  // Shares of GPU 1 up to its memory and cores, and not one beyond.
  const std::uint64_t memory_mib = inventory_.gpus[1].memory_bytes >> 20;
  const dra::ClaimRef first =
      put(shared_claim("0f0e0d0c-0000-4000-8000-000000000023", "gpu-1-shared",
                       std::to_string(memory_mib - 1024) + "Mi", "60"));
  ASSERT_EQ(driver->prepare(first).error, "");
  const dra::ClaimRef too_much_memory =
      put(shared_claim("0f0e0d0c-0000-4000-8000-000000000024", "gpu-1-shared", "2Gi", "10"));
  EXPECT_NE(driver->prepare(too_much_memory).error.find("would hold"), std::string::npos);
  const dra::ClaimRef too_many_cores =
      put(shared_claim("0f0e0d0c-0000-4000-8000-000000000025", "gpu-1-shared", "1Gi", "41"));
  EXPECT_NE(driver->prepare(too_many_cores).error.find("101 of 100 cores"), std::string::npos);
  const dra::ClaimRef fits =
      put(shared_claim("0f0e0d0c-0000-4000-8000-000000000026", "gpu-1-shared", "1Gi", "40"));
  EXPECT_EQ(driver->prepare(fits).error, "");
  // Freed, the whole GPU 0 can be shared.
  EXPECT_EQ(driver->unprepare(whole), "");
  EXPECT_EQ(driver->prepare(share).error, "");
}

TEST_F(DraDriverTest, HostileClaimsGetTheirOwnErrorsAndLeaveNothingBehind) {
  const auto driver = this->driver();
  const auto before = files_under(scratch_.path());
  const std::string base = "0f0e0d0c-0000-4000-8000-0000000001";
  std::vector<std::pair<json, std::string>> cases = {
      {shared_claim(base + "01", "gpu-9", "", ""), "device 'gpu-9' is not one this node publishes"},
      {shared_claim(base + "02", "gpu-0-1g-10gb-0", "", ""), "possible MIG placement"},
      {shared_claim(base + "03", "gpu-0-shared", "1Gi", "10",
                    {{"apiVersion", "gpu.tessera.io/v1alpha1"},
                     {"kind", "GpuSharing"},
                     {"priority", "max"}}),
       "priority: 'max'"},
      {shared_claim(base + "04", "gpu-0-shared", "1000Gi", "10"), "more than GPU 0 has"},
  };
  json malformed = shared_claim(base + "05", "gpu-0", "", "");
  malformed["status"]["allocation"]["devices"]["results"] = "gpu-0";
  cases.push_back({malformed, "must be a list"});
  for (const auto& [claim, expected] : cases) {
    const dra::PrepareAnswer answer = driver->prepare(put(claim));
    EXPECT_NE(answer.error.find(expected), std::string::npos) << answer.error;
    EXPECT_TRUE(answer.devices.empty());
  }
  EXPECT_NE(driver->prepare({"default", "../../etc", "x"}).error.find("is not a UID"),
            std::string::npos);
  EXPECT_NE(driver->prepare({"default", base + "99", "missing"}).error.find("HTTP 404"),
            std::string::npos);
  EXPECT_EQ(files_under(scratch_.path()), before);
  // And a good claim after them is served as ever.
  EXPECT_EQ(driver->prepare(put(shared_claim(base + "10", "gpu-0-shared", "1Gi", "10"))).error, "");
}

// The kubelet prepares the claims of several pods at once, and retries: from many threads, the
// shares granted on one GPU never add up to more than it has, and a claim retried concurrently
// is made once.
TEST_F(DraDriverTest, ConcurrentPreparesNeverOverbookAGpuAndRetriesMakeOneClaim) {
  const auto driver = this->driver();
  constexpr int kClaims = 24;  // 24 x 5 cores: only 20 fit in 100
  std::vector<dra::ClaimRef> claims;
  for (int i = 0; i < kClaims; ++i) {
    claims.push_back(put(shared_claim(fmt::format("0f0e0d0c-0000-4000-8000-0000000003{:02}", i),
                                      "gpu-0-shared", "1Gi", "5")));
  }
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kClaims * 2; i += 8) {  // every claim twice: a retry beside it
        const dra::PrepareAnswer answer =
            driver->prepare(claims[static_cast<std::size_t>(i % kClaims)]);
        if (answer.error.empty() && i >= kClaims) ++granted;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(driver->prepared(), 20u);
  EXPECT_EQ(granted.load(), 20);  // the retries see the claims that were granted
  EXPECT_EQ(files_under(scratch_.file("state/dra/claims")).size(), 20u);
}

TEST_F(DraDriverTest, AnUnhealthyGpuIsNotPrepared) {
  const auto driver = this->driver();
  health_.record_error(0, "XID 79", HealthBoard::Clock::now());
  const dra::PrepareAnswer answer =
      driver->prepare(put(shared_claim("0f0e0d0c-0000-4000-8000-000000000200", "gpu-0", "", "")));
  EXPECT_NE(answer.error.find("unhealthy (XID 79)"), std::string::npos) << answer.error;
}

// --- the manifests in deploy/dra -------------------------------------------------------------

std::vector<json> dra_manifests(const std::string& kind) {
  std::vector<json> found;
  for (const auto& entry :
       fs::directory_iterator(std::string(TESSERA_SOURCE_DIR) + "/deploy/dra")) {
    for (const YAML::Node& document : YAML::LoadAllFromFile(entry.path().string())) {
      if (!document.IsNull() && document["kind"].as<std::string>() == kind) {
        found.push_back(to_json(document));
      }
    }
  }
  return found;
}

// Every opaque config a class or template gives this driver is one it accepts; every template
// names a class there is; every class selects a type of device the pool publishes.
TEST(DraManifests, ClassesAndTemplatesSayWhatTheDriverAcceptsAndPublishes) {
  const std::vector<json> classes = dra_manifests("DeviceClass");
  const std::vector<json> templates = dra_manifests("ResourceClaimTemplate");
  ASSERT_EQ(classes.size(), 3u);
  ASSERT_GE(templates.size(), 5u);
  auto check_configs = [](const json& configs, const std::string& where) {
    for (const json& config : configs) {
      if (config["opaque"]["driver"] != contract::kDraDriverName) continue;
      EXPECT_EQ(config_refusal(config["opaque"]["parameters"].dump()), "") << where;
    }
  };
  std::set<std::string> class_names;
  const std::set<std::string> published_types = {"gpu", "shared", "mig"};
  for (const json& device_class : classes) {
    class_names.insert(device_class["metadata"]["name"]);
    check_configs(device_class["spec"].value("config", json::array()),
                  device_class["metadata"]["name"]);
    const std::string expression = device_class["spec"]["selectors"][0]["cel"]["expression"];
    EXPECT_NE(expression.find("device.driver == \"gpu.tessera.io\""), std::string::npos);
    const std::size_t at = expression.find(".type == \"");
    ASSERT_NE(at, std::string::npos) << expression;
    const std::string type = expression.substr(at + 10, expression.find('"', at + 10) - at - 10);
    EXPECT_TRUE(published_types.contains(type)) << type;
  }
  const Inventory inventory = machine(1, kH100);
  for (const json& claim_template : templates) {
    const std::string where = claim_template["metadata"]["name"];
    const json& devices = claim_template["spec"]["spec"]["devices"];
    check_configs(devices.value("config", json::array()), where);
    for (const json& request : devices["requests"]) {
      EXPECT_TRUE(class_names.contains(request["exactly"]["deviceClassName"])) << where;
      // What a shared request asks is within the shared GPU's request policy.
      if (!request["exactly"].contains("capacity")) continue;
      const json& asked = request["exactly"]["capacity"]["requests"];
      if (asked.contains("memory")) {
        std::int64_t mib = 0;
        ASSERT_TRUE(kube::parse_memory_mib(asked["memory"].get<std::string>(), mib)) << where;
        EXPECT_EQ((static_cast<std::uint64_t>(mib) << 20) % dra::kSharedMemoryStepBytes, 0u)
            << where;
      }
      if (asked.contains("cores")) {
        const int cores = std::stoi(asked["cores"].get<std::string>());
        EXPECT_TRUE(cores >= 1 && cores <= 100) << where;
      }
    }
  }
}

}  // namespace
}  // namespace tessera::test
