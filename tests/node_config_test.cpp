// The node agent's decisions, in process: configs (NVIDIA's v1, the seeds', Tessera's slices)
// read or refused with NVIDIA's messages, the resources and device IDs they give, the
// preferred and granted devices, GFD's labels and what makes a GPU unhealthy.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "contract/annotations.h"
#include "contract/host_layout.h"
#include "contract/layout.h"
#include "contract/variables.h"
#include "extender/cluster_objects.h"
#include "ledger/ledger.h"
#include "node/allocation.h"
#include "node/config.h"
#include "node/container_grants.h"
#include "node/health.h"
#include "node/labels.h"
#include "node/mps.h"
#include "node/resources.h"
#include "support.h"

namespace tessera::test {
namespace {

using namespace tessera::node;
namespace fs = std::filesystem;

std::string example(const std::string& name) {
  return std::string(TESSERA_SOURCE_DIR) + "/examples/node-configs/" + name;
}

// A machine as NVML would describe it: `count` GPUs of a model, UUIDs as the simulated GPU
// gives them.
Inventory machine(int count, const std::string& name = "NVIDIA A100-SXM4-40GB",
                  int numa_every = 0) {
  Inventory inventory;
  inventory.driver_version = "580.65.06";
  inventory.cuda_major = 13;
  for (int i = 0; i < count; ++i) {
    GpuInfo gpu;
    gpu.index = static_cast<unsigned>(i);
    gpu.uuid = simulated_gpu_uuid(i);
    gpu.name = name;
    gpu.memory_bytes = 40960ull << 20;
    gpu.cc_major = name.find("T4") != std::string::npos ? 7 : 8;
    gpu.cc_minor = name.find("T4") != std::string::npos ? 5 : 0;
    gpu.mig_capable = gpu.cc_major >= 8;
    gpu.numa_node = numa_every > 0 ? i / numa_every : -1;
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

// NVIDIA's replica IDs: each GPU's UUID, then ::0 to ::replicas-1.
std::set<std::string> simulated_replica_ids(const std::vector<int>& gpus, int replicas) {
  std::set<std::string> ids;
  for (const int gpu : gpus) {
    for (int i = 0; i < replicas; ++i)
      ids.insert(simulated_gpu_uuid(gpu) + "::" + std::to_string(i));
  }
  return ids;
}

std::map<std::string, std::set<std::string>> resources_of(const ResourceMap& map) {
  std::map<std::string, std::set<std::string>> out;
  for (const Resource& resource : map.resources) {
    for (const AdvertisedDevice& device : resource.devices) out[resource.name].insert(device.id);
  }
  return out;
}

// Refused, naming `field`, with `message` in the reason.
void expect_refused(const std::string& yaml, const std::string& field, const std::string& message) {
  try {
    parse_plugin_config(yaml, "/etc/test/config.yaml");
    ADD_FAILURE() << "accepted:\n" << yaml;
  } catch (const ConfigError& refused) {
    const std::string why = refused.what();
    EXPECT_NE(why.find("/etc/test/config.yaml"), std::string::npos) << why;
    EXPECT_NE(why.find(field), std::string::npos) << "field " << field << " not named: " << why;
    EXPECT_NE(why.find(message), std::string::npos) << "expected '" << message << "' in: " << why;
  }
}

TEST(NodeConfig, EveryNvidiaAndSeedExampleGivesNvidiasResourcesAndIds) {
  const Inventory two = machine(2);
  const std::vector<int> both = {0, 1};
  struct Case {
    const char* file;
    std::map<std::string, std::set<std::string>> expected;
  };
  const std::set<std::string> whole = {simulated_gpu_uuid(0), simulated_gpu_uuid(1)};
  const Case cases[] = {
      {"nvidia-flags.yaml", {{"nvidia.com/gpu", whole}}},
      {"nvidia-time-slicing.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 10)}}},
      {"nvidia-time-slicing-renamed.yaml",
       {{"nvidia.com/gpu.shared", simulated_replica_ids(both, 10)}}},
      {"nvidia-fail-requests.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 10)}}},
      {"seed-any.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 4)}}},
      // mixed, and no GPU has MIG on: whole GPUs shared 8 ways; the MIG resources match nothing.
      {"seed-a100-40gb.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 8)}}},
      {"seed-tesla-t4.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 4)}}},
      {"seed-chapter-time-slicing.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 4)}}},
      {"seed-chapter-mig.yaml", {{"nvidia.com/gpu", whole}}},
      {"tessera-slices.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 4)}}},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.file);
    const PluginConfig config =
        parse_plugin_config(read_text_file(example(test.file)), example(test.file));
    EXPECT_EQ(resources_of(build_resource_map(two, config)), test.expected);
  }
  // Every file in the folder is in the table above, or the MPS one.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(example("")))
    files += entry.path().extension() == ".yaml";
  EXPECT_EQ(files, static_cast<int>(std::size(cases)) + 2);  // + nvidia-mps, partly-shared
}

TEST(NodeConfig, TheSeedsMigStrategySpellingIsTheFlagsAndAContradictionIsRefused) {
  const PluginConfig config =
      parse_plugin_config(read_text_file(example("seed-chapter-mig.yaml")), "chapter");
  EXPECT_EQ(config.flags.mig_strategy, MigStrategy::single);
  expect_refused("version: v1\nflags: {migStrategy: mixed}\nsharing: {mig: {strategy: single}}\n",
                 "sharing.mig.strategy", "contradicts flags.migStrategy");
  expect_refused("sharing: {mig: {strategy: some}}\n", "flags.migStrategy",
                 "invalid --mig-strategy option: some");
}

TEST(NodeConfig, TheTimeSliceIsOneOfNvidiasFourAndOnlyWhenAsked) {
  EXPECT_EQ(parse_plugin_config("flags: {computeTimeslice: long}", "long").flags.compute_timeslice,
            3);
  EXPECT_EQ(
      parse_plugin_config("flags: {computeTimeslice: default}", "reset").flags.compute_timeslice,
      0);
  expect_refused("flags: {computeTimeslice: fast}\n", "flags.computeTimeslice",
                 "invalid time slice: fast (one of: default, short, medium, long)");
  expect_refused("flags: {computeTimeslice: [1]}\n", "flags.computeTimeslice", "");
}

TEST(NodeConfig, NvidiasDefaultsFillWhatAConfigLeavesOut) {
  const PluginConfig config = parse_plugin_config("version: v1\n", "minimal");
  EXPECT_EQ(config.flags.mig_strategy, MigStrategy::none);
  EXPECT_TRUE(config.flags.fail_on_init_error);
  EXPECT_TRUE(config.flags.device_list.envvar);
  EXPECT_FALSE(config.flags.device_list.volume_mounts);
  EXPECT_EQ(config.flags.device_id, DeviceIdStrategy::uuid);
  EXPECT_FALSE(config.flags.pass_device_specs);
  EXPECT_EQ(config.flags.nvidia_driver_root, "/");
  EXPECT_EQ(config.strategy(), SharingStrategy::none);
  EXPECT_EQ(config.flags.compute_timeslice, -1);  // the GPUs' time slice is left alone
  // An empty version is v1; an empty file is the default config.
  EXPECT_NO_THROW(parse_plugin_config("version: \"\"\n", "empty version"));
  EXPECT_EQ(parse_plugin_config("", "empty").strategy(), SharingStrategy::none);
  // JSON is YAML too, as NVIDIA's reader takes it.
  const PluginConfig json = parse_plugin_config(
      R"({"version":"v1","sharing":{"timeSlicing":{"resources":[{"name":"nvidia.com/gpu","replicas":3}]}}})",
      "json");
  EXPECT_EQ(json.time_slicing.resources.at(0).replicas, 3);
  // MPS keeps NVIDIA's historical default: one replica a request.
  EXPECT_TRUE(parse_plugin_config(read_text_file(example("nvidia-mps.yaml")), "mps")
                  .mps.fail_requests_greater_than_one);
  // A name without the prefix gets it, as NVIDIA's NewResourceName does.
  EXPECT_EQ(parse_plugin_config("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}",
                                "short")
                .time_slicing.resources.at(0)
                .name,
            "nvidia.com/gpu");
}

TEST(NodeConfig, InvalidConfigsAreRefusedWithNvidiasMessages) {
  expect_refused("version: v2\n", "version", "unknown version: v2");
  expect_refused("sharing: {timeSlicing: {}}\n", "sharing.timeSlicing", "no resources specified");
  expect_refused("sharing: {timeSlicing: {resources: []}}\n", "sharing.timeSlicing.resources",
                 "no resources specified");
  expect_refused("sharing: {timeSlicing: {resources: [{replicas: 2}]}}\n",
                 "sharing.timeSlicing.resources[0]", "no resource name specified");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}\n",
                 "sharing.timeSlicing.resources[0]", "no replicas specified");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}\n",
                 "sharing.timeSlicing.resources[0].replicas", "number of replicas must be >= 2");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: -3}]}}\n",
                 "replicas", "number of replicas must be >= 2");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: some}]}}\n",
      "devices", "devices set as 'some' but the only valid string input is 'all'");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: 0}]}}\n",
      "devices", "devices set as '0' but a count of devices must be > 0");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: "
      "[GPU-x]}]}}\n",
      "devices[0]", "unsupported type for device in devices list");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: \"nvidia.com/GPU!\", replicas: 2}]}}\n", "name",
      "incorrect format for resource name 'nvidia.com/GPU!'");
  expect_refused("flags: {plugin: {deviceListStrategy: carrier-pigeon}}\n",
                 "flags.plugin.deviceListStrategy",
                 "invalid --device-list-strategy option: invalid strategy: carrier-pigeon");
  expect_refused("flags: {plugin: {deviceIDStrategy: serial}}\n", "flags.plugin.deviceIDStrategy",
                 "invalid --device-id-strategy option: serial");
  expect_refused(
      "flags: {migStrategy: mixed}\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: "
      "2}]}}\n"
      "",
      "flags.migStrategy", "using --mig-strategy=mixed is not supported with MPS");
  expect_refused("sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n",
                 "flags.mpsRoot", "using MPS requires --mps-root to be specified");
  expect_refused("health: {eventTypes: [EventTypeNothing]}\n", "health.eventTypes[0]",
                 "invalid event type: EventTypeNothing");
  expect_refused("health: {ignoredXIDs: [79], criticalXIDs: [79]}\n", "health.criticalXIDs",
                 "XID 79 is in both ignored and critical lists");
}

TEST(NodeConfig, UnknownFieldsWrongTypesAndContradictionsAreRefusedNamingFieldAndValue) {
  expect_refused(
      "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicsa: 4}]}}\n",
      "sharing.timeSlicing.resources[0].replicsa", "unknown field");
  expect_refused("flags: {migStratgy: none}\n", "flags.migStratgy", "unknown field (known here:");
  expect_refused("verison: v1\n", "verison", "unknown field");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: \"4\"}]}}\n",
                 "replicas", "must be a whole number, not '4'");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4.5}]}}\n",
                 "replicas", "must be a whole number, not '4.5'");
  expect_refused("flags: {failOnInitError: maybe}\n", "flags.failOnInitError",
                 "must be true or false, not 'maybe'");
  expect_refused("flags: {failOnInitError: \"true\"}\n", "flags.failOnInitError",
                 "must be true or false");
  expect_refused("flags: [a, b]\n", "flags", "must be a mapping, not a list");
  expect_refused("flags: {mpsRoot: 12}\n", "flags.mpsRoot", "must be a string, not 12");
  expect_refused("version: v1\nversion: v1\n", "version", "is given twice");
  expect_refused(
      "sharing:\n  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
      "  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\nflags: {mpsRoot: /run/mps}\n",
      "sharing", "timeSlicing and mps are both set");
  expect_refused(
      "sharing:\n  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
      "  slices: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
      "sharing.slices", "nvidia.com/gpu is also shared by timeSlicing");
  expect_refused(
      "sharing: {slices: {resources: [{name: nvidia.com/gpu, replicas: 4, memoryPerSlice: "
      "8XB}]}}\n",
      "memoryPerSlice", "'8XB' is not a size");
  expect_refused(
      "sharing: {slices: {resources: [{name: nvidia.com/gpu, replicas: 4, coresPerSlice: 101}]}}\n",
      "coresPerSlice", "101 is out of range (1 to 100)");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, memoryPerSlice: "
      "1GiB}]}}\n",
      "memoryPerSlice", "unknown field");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}, "
      "{name: nvidia.com/gpu, replicas: 3}]}}\n",
      "resources[1]", "resource nvidia.com/gpu is listed twice");
  expect_refused("version: [v1\n", "", "not YAML");
}

TEST(NodeConfig, HostileConfigsAreRefusedBeforeTheyCanHurt) {
  // Nesting that would overflow a recursive parser's stack.
  expect_refused(std::string(100000, '[') + std::string(100000, ']'), "",
                 "nested more than 32 deep");
  // Larger than any config.
  expect_refused("# " + std::string(kMostConfigBytes, 'x') + "\n", "", "larger than 256 KiB");
  // Aliases that multiply a small file into a huge tree.
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char name = 'b'; name <= 'j'; ++name) {
    bomb += std::string(1, name) + ": &" + name + " [*" + char(name - 1) + ", *" + char(name - 1) +
            ", *" + char(name - 1) + ", *" + char(name - 1) + ", *" + char(name - 1) + "]\n";
  }
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: [0]}]}}\n" +
          bomb,
      "", "unknown field");
  expect_refused("imex: {channelIDs: " + std::string("[1,") + std::string(300000, ' ') + "2]}\n",
                 "", "larger than 256 KiB");
  // Not text at all.
  const std::string binary("\x00\xff\xfe\x01\x7f", 5);
  EXPECT_THROW(parse_plugin_config(binary, "binary"), ConfigError);
}

TEST(NodeConfig, NamedConfigsComeFromADirectoryMountedAsAConfigMapIs) {
  ScratchDirectory scratch;
  // A ConfigMap volume: ..data links to a timestamped directory, each key links through it.
  const std::string data = scratch.file("..2026_12_03_10_00_00.000000001");
  fs::create_directory(data);
  std::ofstream(data + "/any") << read_text_file(example("seed-any.yaml"));
  std::ofstream(data + "/tesla-t4") << read_text_file(example("seed-tesla-t4.yaml"));
  std::ofstream(data + "/broken")
      << "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}\n";
  fs::create_directory_symlink(data, scratch.file("..data"));
  for (const char* key : {"any", "tesla-t4", "broken"}) {
    fs::create_symlink(std::string("..data/") + key, scratch.file(key));
  }
  const ConfigSet set = read_config_directory(scratch.path());
  EXPECT_EQ(set.configs.size(), 2u);
  ASSERT_EQ(set.refused.count("broken"), 1u);
  EXPECT_NE(set.refused.at("broken").find("no replicas specified"), std::string::npos);

  EXPECT_EQ(choose_config(set, {"tesla-t4", "any"}).name, "tesla-t4");  // the label wins
  EXPECT_EQ(choose_config(set, {"", "any"}).name, "any");               // then --config
  try {
    choose_config(set, {"a100-80gb", "any"});
    ADD_FAILURE() << "a missing config was chosen";
  } catch (const ConfigError& refused) {
    EXPECT_NE(std::string(refused.what())
                  .find("nvidia.com/device-plugin.config names config 'a100-80gb'"),
              std::string::npos)
        << refused.what();
  }
  try {
    choose_config(set, {"broken", ""});
    ADD_FAILURE() << "a refused config was chosen";
  } catch (const ConfigError& refused) {
    EXPECT_NE(std::string(refused.what()).find("no replicas specified"), std::string::npos);
  }
  EXPECT_THROW(choose_config(set, {"", ""}), ConfigError);  // several, and nothing chooses
  // One config and nothing choosing: that one; none at all: NVIDIA's default.
  const ConfigSet single = read_config_file(example("seed-any.yaml"), "default");
  EXPECT_EQ(choose_config(single, {"", ""}).time_slicing.resources.at(0).replicas, 4);
  EXPECT_EQ(choose_config(ConfigSet{}, {"", ""}).strategy(), SharingStrategy::none);
}

TEST(NodeResources, SharingSomeGpusLeavesTheOthersWholeAndRenamesAsAsked) {
  const Inventory four = machine(4);
  // devices: [0, 1] as slices: GPUs 2 and 3 whole in the same resource, as NVIDIA leaves them.
  const ResourceMap partly = build_resource_map(
      four, parse_plugin_config(read_text_file(example("tessera-partly-shared.yaml")), "partly"));
  std::set<std::string> expected = simulated_replica_ids({0, 1}, 4);
  expected.insert(simulated_gpu_uuid(2));
  expected.insert(simulated_gpu_uuid(3));
  EXPECT_EQ(resources_of(partly).at("nvidia.com/gpu"), expected);
  // A count takes the first GPUs; rename moves the replicas to their own resource.
  const ResourceMap renamed = build_resource_map(
      four,
      parse_plugin_config("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, rename: "
                          "gpu-small, replicas: 3, devices: 1}]}}",
                          "renamed"));
  EXPECT_EQ(resources_of(renamed).at("nvidia.com/gpu-small"), simulated_replica_ids({0}, 3));
  EXPECT_EQ(
      resources_of(renamed).at("nvidia.com/gpu"),
      (std::set<std::string>{simulated_gpu_uuid(1), simulated_gpu_uuid(2), simulated_gpu_uuid(3)}));
  // A UUID in the list, and one not on this node.
  const ResourceMap by_uuid = build_resource_map(
      four,
      parse_plugin_config("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, "
                          "devices: [\"" +
                              simulated_gpu_uuid(3) + "\"]}]}}",
                          "by-uuid"));
  EXPECT_EQ(by_uuid.find("nvidia.com/gpu")->devices.size(), 3u + 2u);
  EXPECT_THROW(build_resource_map(
                   machine(2), parse_plugin_config("sharing: {timeSlicing: {resources: [{name: "
                                                   "nvidia.com/gpu, replicas: 2, devices: [3]}]}}",
                                                   "absent")),
               ConfigError);
}

TEST(NodeResources, NvidiasMigStrategiesHoldForGpusWithoutMigDevices) {
  Inventory mixed_modes = machine(2);
  mixed_modes.gpus[1].mig_enabled = true;
  const PluginConfig single = parse_plugin_config("flags: {migStrategy: single}", "single");
  try {
    build_resource_map(mixed_modes, single);
    ADD_FAILURE() << "mixed MIG enablement accepted under single";
  } catch (const ConfigError& refused) {
    EXPECT_NE(
        std::string(refused.what())
            .find("all devices on the node must be configured with the same migEnabled value"),
        std::string::npos);
  }
  Inventory all_mig = machine(2);
  for (GpuInfo& gpu : all_mig.gpus) gpu.mig_enabled = true;
  try {
    build_resource_map(all_mig, single);
    ADD_FAILURE() << "MIG GPUs without MIG devices accepted under single";
  } catch (const ConfigError& refused) {
    EXPECT_NE(std::string(refused.what()).find("device 0 has no MIG devices configured"),
              std::string::npos);
  }
  // mixed serves the GPUs whose MIG mode is off, whole; none serves every GPU whole.
  const ResourceMap mixed =
      build_resource_map(mixed_modes, parse_plugin_config("flags: {migStrategy: mixed}", "m"));
  EXPECT_EQ(resources_of(mixed).at("nvidia.com/gpu"), std::set<std::string>{simulated_gpu_uuid(0)});
  EXPECT_EQ(resources_of(build_resource_map(mixed_modes, parse_plugin_config("", "none")))
                .at("nvidia.com/gpu")
                .size(),
            2u);
}

// MIG devices as the simulated GPU names them, on GPU `gpu`: its instances' profiles in order.
void give_mig_devices(GpuInfo& gpu, const std::vector<std::string>& profiles) {
  gpu.mig_enabled = true;
  for (const std::string& profile : profiles) {
    const int index = static_cast<int>(gpu.mig_devices.size());
    gpu.mig_devices.push_back(
        {fmt::format("MIG-7e55e7a0-{:04x}-4{:03x}-8000-00000000000{}", gpu.index, index + 1, index),
         profile, index, static_cast<unsigned>(index + 1), 0,
         (profile.rfind("3g", 0) == 0 ? 19968ull : 4864ull) << 20,
         profile.rfind("3g", 0) == 0 ? 42 : 14});
  }
}

// NVIDIA's MPS config: replicas like time-slicing's, served through a daemon per resource
// with NVIDIA's defaults; more replicas than MPS has clients, and MIG devices, are refused.
TEST(NodeResources, MpsReplicasAreServedThroughOneDaemonPerResourceWithNvidiasDefaults) {
  const Inventory two = machine(2);
  const PluginConfig config =
      parse_plugin_config(read_text_file(example("nvidia-mps.yaml")), "mps");
  const ResourceMap map = build_resource_map(two, config);
  const Resource* shared = map.find("nvidia.com/gpu");
  ASSERT_NE(shared, nullptr);
  EXPECT_TRUE(shared->mps);
  EXPECT_EQ(shared->devices.size(), 20u);
  const std::vector<MpsDaemonSpec> daemons = mps_daemon_specs(two, config, map);
  ASSERT_EQ(daemons.size(), 1u);
  EXPECT_EQ(daemons[0].pipe_dir, "/run/nvidia/mps/nvidia.com/gpu/pipe");
  EXPECT_EQ(daemons[0].log_dir, "/run/nvidia/mps/nvidia.com/gpu/log");
  EXPECT_EQ(daemons[0].thread_percentage, 10);
  EXPECT_EQ(daemons[0].uuids,
            (std::vector<std::string>{simulated_gpu_uuid(0), simulated_gpu_uuid(1)}));
  EXPECT_EQ(daemons[0].pinned_bytes, (std::vector<std::uint64_t>(2, (40960ull << 20) / 10)));
  ContainerAllocation allocation;
  add_mps_access(allocation, config, "nvidia.com/gpu");
  EXPECT_EQ(allocation.envs.at("CUDA_MPS_PIPE_DIRECTORY"), "/run/nvidia/mps/nvidia.com/gpu/pipe");
  ASSERT_EQ(allocation.mounts.size(), 2u);
  EXPECT_EQ(allocation.mounts[1].container_path, "/dev/shm");
  EXPECT_EQ(allocation.mounts[1].host_path, "/run/nvidia/mps/shm");
  // A container is held to its replicas' memory, per GPU in the order it sees them, across
  // all its processes; no compute share (the thread percentage divides the SMs).
  const PluginConfig several = parse_plugin_config(
      "flags: {mpsRoot: /run/mps}\nsharing: {mps: {failRequestsGreaterThanOne: false, "
      "resources: [{name: nvidia.com/gpu, replicas: 3}]}}",
      "several");
  const ResourceMap several_map = build_resource_map(two, several);
  const ContainerGrant grant =
      mps_container_grant(two, *several_map.find("nvidia.com/gpu"),
                          {simulated_gpu_uuid(1) + "::0", simulated_gpu_uuid(0) + "::2",
                           simulated_gpu_uuid(1) + "::1"});
  EXPECT_EQ(grant.gpus, (std::vector<int>{1, 0}));
  const std::uint64_t third = (40960ull << 20) / 3 >> 20 << 20;  // in whole MiB, as MPS is told
  EXPECT_EQ(grant.memory_bytes, (std::vector<std::uint64_t>{2 * third, third}));
  EXPECT_EQ(grant.cores, (std::vector<int>{0, 0}));
  EXPECT_EQ(mps_daemon_specs(two, several, several_map)[0].pinned_bytes,
            (std::vector<std::uint64_t>(2, third)));
  // Time-slicing needs no daemon.
  const PluginConfig sliced = parse_plugin_config(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}", "ts");
  EXPECT_TRUE(mps_daemon_specs(two, sliced, build_resource_map(two, sliced)).empty());

  const std::string mps_of =
      "flags: {mpsRoot: /run/mps}\nsharing: {mps: {resources: [{name: "
      "nvidia.com/gpu, replicas: ";
  try {
    build_resource_map(two, parse_plugin_config(mps_of + "49}]}}", "many"));
    ADD_FAILURE() << "49 MPS replicas served";
  } catch (const ConfigError& refused) {
    EXPECT_NE(std::string(refused.what())
                  .find("sharing.mps.resources[0]: replicas: 49 is more clients than MPS serves "
                        "on a GPU (48)"),
              std::string::npos)
        << refused.what();
  }
  EXPECT_NO_THROW(build_resource_map(two, parse_plugin_config(mps_of + "48}]}}", "most")));
  Inventory mig = machine(1);
  give_mig_devices(mig.gpus[0], {"3g.20gb"});
  try {
    build_resource_map(mig, parse_plugin_config("flags: {migStrategy: single, mpsRoot: /run/mps}\n"
                                                "sharing: {mps: {resources: [{name: "
                                                "nvidia.com/gpu, replicas: 2}]}}",
                                                "mig"));
    ADD_FAILURE() << "MPS served on MIG devices";
  } catch (const ConfigError& refused) {
    EXPECT_NE(
        std::string(refused.what()).find("sharing using MPS is not supported for MIG devices"),
        std::string::npos)
        << refused.what();
  }
}

TEST(NodeResources, MigDevicesAreServedPerStrategyWithNvidiasNamesAndIds) {
  Inventory node = machine(3);
  give_mig_devices(node.gpus[1], {"3g.20gb", "1g.5gb", "1g.5gb+me"});
  give_mig_devices(node.gpus[2], {"1g.5gb"});
  const auto& mig1 = node.gpus[1].mig_devices;
  // mixed: GPU 0 whole; MIG devices by profile, +me as .me.
  const PluginConfig mixed = parse_plugin_config("flags: {migStrategy: mixed}", "mixed.yaml");
  const ResourceMap map = build_resource_map(node, mixed);
  const auto served = resources_of(map);
  EXPECT_EQ(served.at("nvidia.com/gpu"), std::set<std::string>{simulated_gpu_uuid(0)});
  EXPECT_EQ(served.at("nvidia.com/mig-3g.20gb"), std::set<std::string>{mig1[0].uuid});
  EXPECT_EQ(served.at("nvidia.com/mig-1g.5gb"),
            (std::set<std::string>{mig1[1].uuid, node.gpus[2].mig_devices[0].uuid}));
  EXPECT_EQ(served.at("nvidia.com/mig-1g.5gb.me"), std::set<std::string>{mig1[2].uuid});
  // A container given a MIG device sees it by UUID, or by <gpu>:<mig> with index IDs.
  const Resource& small = *map.find("nvidia.com/mig-1g.5gb");
  const std::vector<DeviceRef> granted = requested_devices(small, {mig1[1].uuid});
  ASSERT_EQ(granted.size(), 1u);
  EXPECT_EQ(expose_devices(node, mixed, granted, "r").envs.at(contract::kVisibleDevicesVariable),
            mig1[1].uuid);
  const PluginConfig by_index =
      parse_plugin_config("flags: {migStrategy: mixed, plugin: {deviceIDStrategy: index}}", "i");
  EXPECT_EQ(expose_devices(node, by_index, granted, "r").envs.at(contract::kVisibleDevicesVariable),
            "1:1");

  // Time-slicing of a MIG resource, as NVIDIA allows it; slices of MIG devices are refused.
  const ResourceMap shared = build_resource_map(
      node, parse_plugin_config("flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n"
                                "    resources:\n    - name: nvidia.com/mig-1g.5gb\n"
                                "      replicas: 2\n",
                                "ts.yaml"));
  EXPECT_EQ(resources_of(shared).at("nvidia.com/mig-1g.5gb"),
            (std::set<std::string>{mig1[1].uuid + "::0", mig1[1].uuid + "::1",
                                   node.gpus[2].mig_devices[0].uuid + "::0",
                                   node.gpus[2].mig_devices[0].uuid + "::1"}));
  EXPECT_EQ(resources_of(shared).at("nvidia.com/mig-3g.20gb").size(), 1u);
  try {
    build_resource_map(node,
                       parse_plugin_config("flags: {migStrategy: mixed}\nsharing:\n  slices:\n"
                                           "    resources:\n    - name: nvidia.com/mig-1g.5gb\n"
                                           "      replicas: 2\n",
                                           "slices.yaml"));
    ADD_FAILURE() << "slices of MIG devices accepted";
  } catch (const ConfigError& refused) {
    EXPECT_NE(std::string(refused.what()).find("slices of MIG devices are not served"),
              std::string::npos)
        << refused.what();
  }

  // single: every GPU with MIG on and one profile, served as nvidia.com/gpu.
  const PluginConfig single = parse_plugin_config("flags: {migStrategy: single}", "single.yaml");
  auto refusal = [&](const Inventory& inventory) {
    try {
      build_resource_map(inventory, single);
    } catch (const ConfigError& refused) {
      return std::string(refused.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal(node).find("all devices on the node must be configured with the same "
                               "migEnabled value"),
            std::string::npos);
  Inventory all_mig = machine(2);
  give_mig_devices(all_mig.gpus[0], {"3g.20gb", "1g.5gb"});
  give_mig_devices(all_mig.gpus[1], {"3g.20gb"});
  EXPECT_NE(refusal(all_mig).find("single: more than one MIG device type present on node"),
            std::string::npos);
  Inventory uniform = machine(2);
  give_mig_devices(uniform.gpus[0], {"3g.20gb", "3g.20gb"});
  give_mig_devices(uniform.gpus[1], {"3g.20gb"});
  const auto uniform_served = resources_of(build_resource_map(uniform, single));
  ASSERT_EQ(uniform_served.size(), 1u);
  EXPECT_EQ(uniform_served.at("nvidia.com/gpu").size(), 3u);
  EXPECT_EQ(uniform_served.at("nvidia.com/gpu").count(uniform.gpus[1].mig_devices[0].uuid), 1u);
  // none: MIG devices ignored, every GPU whole.
  EXPECT_EQ(resources_of(build_resource_map(node, parse_plugin_config("", "none"))),
            (std::map<std::string, std::set<std::string>>{
                {"nvidia.com/gpu",
                 {simulated_gpu_uuid(0), simulated_gpu_uuid(1), simulated_gpu_uuid(2)}}}));

  // GFD's MIG labels, and the capacity annotation the scheduler reads.
  const Labels mixed_labels = gpu_labels(node, mixed, 0);
  EXPECT_EQ(mixed_labels.at("nvidia.com/mig.strategy"), "mixed");
  EXPECT_EQ(mixed_labels.at("nvidia.com/gpu.sharing"), "mig");
  EXPECT_EQ(mixed_labels.at("nvidia.com/mig-1g.5gb.count"), "2");
  EXPECT_EQ(mixed_labels.at("nvidia.com/mig-1g.5gb.memory"), "4864");
  EXPECT_EQ(mixed_labels.at("nvidia.com/mig-3g.20gb.multiprocessors"), "42");
  EXPECT_EQ(mixed_labels.at("nvidia.com/mig-1g.5gb.me.count"), "1");
  const Labels single_labels = gpu_labels(uniform, single, 0);
  EXPECT_EQ(single_labels.at("nvidia.com/gpu.product"), "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb");
  EXPECT_EQ(single_labels.at("nvidia.com/gpu.count"), "3");
  EXPECT_EQ(single_labels.at("nvidia.com/gpu.memory"), "19968");
  HealthBoard health(3);
  const nlohmann::json annotation = gpus_annotation(node, map, health, mixed.strategy());
  ASSERT_EQ(annotation["gpus"].size(), 3u);
  EXPECT_EQ(annotation["gpus"][0]["sharing"], "none");
  EXPECT_EQ(annotation["gpus"][1]["sharing"], "mig");
  EXPECT_EQ(annotation["gpus"][1]["mig_devices"].size(), 3u);
  EXPECT_EQ(annotation["gpus"][1]["mig_devices"][2]["profile"], "1g.5gb+me");
  // The scheduler leaves MIG GPUs to the kubelet's counts: only GPU 0 is its to place on.
  const nlohmann::json described = {
      {"metadata",
       {{"name", "mig-node"}, {"annotations", {{contract::kGpusAnnotation, annotation.dump()}}}}},
      {"status", {{"allocatable", {{"cpu", "32"}, {"memory", "256Gi"}}}}}};
  const extender::NodeInfo info = extender::node_from_json(described);
  EXPECT_EQ(info.spec.gpus, 1);
  EXPECT_EQ(info.gpu_uuids, std::vector<std::string>{simulated_gpu_uuid(0)});
  // Its MIG devices by profile, each weighing its share of the GPU's memory.
  const nlohmann::json& mig_gpu = annotation["gpus"][1];
  const auto share = [&](const std::string& profile) {
    for (const nlohmann::json& device : mig_gpu["mig_devices"]) {
      if (device["profile"] != profile) continue;
      const std::int64_t memory = device["memory_mib"];
      const std::int64_t whole = mig_gpu["memory_mib"];
      return static_cast<int>((memory * 1000 + whole / 2) / whole);
    }
    return -1;
  };
  ASSERT_EQ(info.spec.mig.size(), 3u);
  std::map<std::string, sched::MigDevices> by_profile;
  for (const sched::MigDevices& devices : info.spec.mig) by_profile[devices.profile] = devices;
  EXPECT_TRUE(by_profile["1g.5gb"] == (sched::MigDevices{"1g.5gb", 2, share("1g.5gb")}));
  EXPECT_TRUE(by_profile["1g.5gb.me"] == (sched::MigDevices{"1g.5gb.me", 1, share("1g.5gb+me")}));
  EXPECT_TRUE(by_profile["3g.20gb"] == (sched::MigDevices{"3g.20gb", 1, share("3g.20gb")}));
  EXPECT_GT(by_profile["3g.20gb"].milli, 2 * by_profile["1g.5gb"].milli);
  // The engine places a pod of two 1g devices there, and no third.
  sched::Cluster cluster({info.spec});
  sched::PodSpec two;
  two.mig = {{"1g.5gb", 2}};
  std::mt19937_64 random(1);
  const sched::Request request = cluster.request_for(two);
  const sched::Placement placed = cluster.place(request, sched::Policy::fgd_balanced, random);
  ASSERT_EQ(placed.node, 0);
  cluster.allocate(request, placed);
  EXPECT_EQ(cluster.mig_free(0, "1g.5gb"), 0);
  EXPECT_EQ(cluster.place(request, sched::Policy::fgd_balanced, random).node, -1);
  // A device without its memory cannot be weighed: the annotation is refused, naming it.
  nlohmann::json damaged = annotation;
  damaged["gpus"][1]["mig_devices"][0].erase("memory_mib");
  const std::string damaged_profile = damaged["gpus"][1]["mig_devices"][0]["profile"];
  nlohmann::json damaged_node = described;
  damaged_node["metadata"]["annotations"][contract::kGpusAnnotation] = damaged.dump();
  try {
    extender::node_from_json(damaged_node);
    ADD_FAILURE() << "accepted a MIG device without memory_mib";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(
        std::string(error.what()).find("MIG device " + damaged_profile + ": memory_mib is missing"),
        std::string::npos)
        << error.what();
  }
}

TEST(NodeAllocation, ReplicasAreDistributedOrPackedAndWholeGpusStayOnOneNumaNode) {
  const Inventory two = machine(2);
  const ResourceMap map =
      build_resource_map(two, parse_plugin_config(read_text_file(example("seed-any.yaml")), "any"));
  const Resource& gpu = *map.find("nvidia.com/gpu");
  // GPU 0 has two of its replicas allocated already (not available).
  std::vector<std::string> available = {simulated_gpu_uuid(0) + "::2",
                                        simulated_gpu_uuid(0) + "::3"};
  for (int i = 0; i < 4; ++i) available.push_back(simulated_gpu_uuid(1) + "::" + std::to_string(i));
  const auto spread = preferred_allocation(gpu, available, {}, 2, ReplicaPolicy::distributed);
  EXPECT_EQ(spread, (std::vector<std::string>{simulated_gpu_uuid(1) + "::0",
                                              simulated_gpu_uuid(1) + "::1"}));
  const auto packed = preferred_allocation(gpu, available, {}, 1, ReplicaPolicy::packed);
  EXPECT_EQ(packed, (std::vector<std::string>{simulated_gpu_uuid(0) + "::2"}));
  const auto with_required = preferred_allocation(gpu, available, {simulated_gpu_uuid(1) + "::3"},
                                                  2, ReplicaPolicy::distributed);
  EXPECT_EQ(with_required.front(), simulated_gpu_uuid(1) + "::3");
  EXPECT_EQ(with_required.size(), 2u);
  EXPECT_THROW(preferred_allocation(gpu, available, {}, 7, ReplicaPolicy::distributed),
               AllocationError);
  EXPECT_THROW(preferred_allocation(gpu, {"GPU-nope::0"}, {}, 1, ReplicaPolicy::distributed),
               AllocationError);

  // Whole GPUs on two NUMA nodes of 4: a request of 2 stays on one node, the fuller one.
  const Inventory eight = machine(8, "NVIDIA H100 80GB HBM3", 4);
  const ResourceMap whole = build_resource_map(eight, default_plugin_config());
  const Resource& gpus = *whole.find("nvidia.com/gpu");
  const std::vector<std::string> free_gpus = {
      simulated_gpu_uuid(1), simulated_gpu_uuid(2), simulated_gpu_uuid(3), simulated_gpu_uuid(4),
      simulated_gpu_uuid(5), simulated_gpu_uuid(6), simulated_gpu_uuid(7)};
  const auto chosen = preferred_allocation(gpus, free_gpus, {}, 2, ReplicaPolicy::distributed);
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_EQ(gpus.find(chosen[0])->numa_node, gpus.find(chosen[1])->numa_node);
  EXPECT_EQ(gpus.find(chosen[0])->numa_node, 0);  // node 0 has 3 free, node 1 has 4: pack node 0
  const auto four = preferred_allocation(gpus, free_gpus, {}, 4, ReplicaPolicy::distributed);
  std::set<int> nodes;
  for (const std::string& id : four) nodes.insert(gpus.find(id)->numa_node);
  EXPECT_EQ(nodes, std::set<int>{1});  // only node 1 holds four
  const auto near =
      preferred_allocation(gpus, free_gpus, {simulated_gpu_uuid(5)}, 2, ReplicaPolicy::distributed);
  EXPECT_EQ(gpus.find(near[1])->numa_node, 1);  // beside what must be included
}

TEST(NodeAllocation, AContainerGetsItsGpusAsEveryDeviceListStrategySaysIt) {
  const Inventory two = machine(2);
  PluginConfig config =
      parse_plugin_config(read_text_file(example("nvidia-fail-requests.yaml")), "fail");
  const ResourceMap map = build_resource_map(two, config);
  const Resource& gpu = *map.find("nvidia.com/gpu");
  try {
    requested_gpus(gpu, {simulated_gpu_uuid(0) + "::0", simulated_gpu_uuid(1) + "::0"});
    ADD_FAILURE() << "two replicas granted with failRequestsGreaterThanOne";
  } catch (const AllocationError& refused) {
    EXPECT_STREQ(refused.what(),
                 "invalid request: maximum request size for shared resources is 1; found 2");
  }
  EXPECT_THROW(requested_gpus(gpu, {"GPU-unknown::0"}), AllocationError);
  // Two replicas of one GPU are one GPU to the container.
  config.time_slicing.fail_requests_greater_than_one = false;
  const ResourceMap relaxed = build_resource_map(two, config);
  EXPECT_EQ(requested_gpus(*relaxed.find("nvidia.com/gpu"),
                           {simulated_gpu_uuid(1) + "::0", simulated_gpu_uuid(1) + "::3",
                            simulated_gpu_uuid(0) + "::1"}),
            (std::vector<int>{1, 0}));

  PluginConfig flags = default_plugin_config();
  ContainerAllocation envvar = expose_gpus(two, flags, {1, 0}, "r1");
  EXPECT_EQ(envvar.envs.at(contract::kVisibleDevicesVariable),
            simulated_gpu_uuid(1) + "," + simulated_gpu_uuid(0));
  EXPECT_TRUE(envvar.mounts.empty());
  flags.flags.device_id = DeviceIdStrategy::index;
  EXPECT_EQ(expose_gpus(two, flags, {1, 0}, "r1").envs.at(contract::kVisibleDevicesVariable),
            "1,0");
  flags = parse_plugin_config(
      "flags: {plugin: {deviceListStrategy: [volume-mounts, cdi-annotations, cdi-cri], "
      "passDeviceSpecs: true}}",
      "all");
  const ContainerAllocation all = expose_gpus(two, flags, {0}, "response-7");
  EXPECT_EQ(all.envs.at(contract::kVisibleDevicesVariable), "/var/run/nvidia-container-devices");
  ASSERT_EQ(all.mounts.size(), 1u);
  EXPECT_EQ(all.mounts[0].container_path,
            "/var/run/nvidia-container-devices/" + simulated_gpu_uuid(0));
  EXPECT_EQ(all.mounts[0].host_path, "/dev/null");
  EXPECT_EQ(all.annotations.at("cdi.k8s.io/nvidia-device-plugin_response-7"),
            "k8s.device-plugin.nvidia.com/gpu=" + simulated_gpu_uuid(0));
  EXPECT_EQ(all.cdi_devices,
            std::vector<std::string>{"k8s.device-plugin.nvidia.com/gpu=" + simulated_gpu_uuid(0)});
  ASSERT_GE(all.devices.size(), 2u);
  EXPECT_EQ(all.devices[0].container_path, "/dev/nvidia0");
  EXPECT_EQ(all.devices[0].permissions, "rw");
  EXPECT_EQ(all.devices[1].container_path, "/dev/nvidiactl");
}

// With passDeviceSpecs, a MIG device's container gets its GPU's node and the nodes of its
// GPU and compute instances' capabilities, whose minors the driver gives in /proc; a
// capability the driver does not describe refuses the allocation, naming the file.
TEST(NodeAllocation, PassDeviceSpecsGivesAMigDeviceItsInstanceCapabilityNodes) {
  ScratchDirectory root;
  Inventory node = machine(2);
  give_mig_devices(node.gpus[1], {"3g.20gb", "1g.5gb"});
  PluginConfig config =
      parse_plugin_config("flags: {migStrategy: mixed, plugin: {passDeviceSpecs: true}}", "mixed");
  config.flags.nvidia_dev_root = root.path();
  const std::string caps = root.file("proc/driver/nvidia/capabilities/gpu1/mig/gi2");
  std::filesystem::create_directories(caps + "/ci0");
  std::ofstream(caps + "/access") << "DeviceFileMinor: 21\nDeviceFileMode: 292\n";
  std::ofstream(caps + "/ci0/access") << "DeviceFileMinor: 22\nDeviceFileMode: 292\n";
  const ContainerAllocation mig = expose_devices(node, config, {{1, 1}}, "r");
  std::vector<std::string> paths;
  for (const DeviceNodeSpec& device : mig.devices) paths.push_back(device.container_path);
  EXPECT_EQ(paths, (std::vector<std::string>{"/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap21",
                                             "/dev/nvidia-caps/nvidia-cap22", "/dev/nvidiactl"}));
  EXPECT_EQ(mig.devices[1].host_path, root.path() + "/dev/nvidia-caps/nvidia-cap21");
  // Instance 1 (the 3g) has no capability files here; a file without a minor is refused too.
  try {
    expose_devices(node, config, {{1, 0}}, "r");
    ADD_FAILURE() << "allocated without the instance's capability";
  } catch (const AllocationError& refused) {
    EXPECT_NE(std::string(refused.what()).find("gpu1/mig/gi1/access: cannot be read"),
              std::string::npos)
        << refused.what();
  }
  std::ofstream(caps + "/ci0/access") << "DeviceFileMode: 292\n";
  EXPECT_THROW(expose_devices(node, config, {{1, 1}}, "r"), AllocationError);
  // Whole GPUs need none of it.
  EXPECT_EQ(expose_devices(node, config, {{0, -1}}, "r").devices.size(), 2u);
}

TEST(NodeLabels, GfdLabelsSayWhatNvidiasSayWithTheSeedsSharingLabel) {
  const Inventory t4 = machine(4, "Tesla T4");
  const PluginConfig shared =
      parse_plugin_config(read_text_file(example("seed-tesla-t4.yaml")), "t4");
  Labels labels = gpu_labels(t4, shared, 1700000000);
  // As the time-slicing article shows them for this config.
  EXPECT_EQ(labels.at("nvidia.com/gpu.count"), "4");
  EXPECT_EQ(labels.at("nvidia.com/gpu.product"), "Tesla-T4-SHARED");
  EXPECT_EQ(labels.at("nvidia.com/gpu.replicas"), "4");
  EXPECT_EQ(labels.at("nvidia.com/gpu.sharing-strategy"), "time-slicing");
  EXPECT_EQ(labels.at("nvidia.com/gpu.family"), "turing");
  EXPECT_EQ(labels.at("nvidia.com/gpu.compute.major"), "7");
  EXPECT_EQ(labels.at("nvidia.com/gpu.compute.minor"), "5");
  EXPECT_EQ(labels.at("nvidia.com/gpu.memory"), "40960");
  EXPECT_EQ(labels.at("nvidia.com/gpu.sharing"), "timeslice");
  EXPECT_EQ(labels.at("nvidia.com/mig.capable"), "false");
  EXPECT_EQ(labels.at("nvidia.com/mig.strategy"), "none");
  EXPECT_EQ(labels.at("nvidia.com/mps.capable"), "false");
  EXPECT_EQ(labels.at("nvidia.com/cuda.driver-version.full"), "580.65.06");
  EXPECT_EQ(labels.at("nvidia.com/cuda.driver.major"), "580");
  EXPECT_EQ(labels.at("nvidia.com/cuda.runtime-version.major"), "13");
  EXPECT_EQ(labels.at("nvidia.com/gfd.timestamp"), "1700000000");
  // Renamed: the product keeps its name. Not shared: replicas 1, strategy none.
  labels = gpu_labels(
      t4, parse_plugin_config(read_text_file(example("nvidia-time-slicing-renamed.yaml")), "r"), 0);
  EXPECT_EQ(labels.at("nvidia.com/gpu.product"), "Tesla-T4");
  labels = gpu_labels(t4, default_plugin_config(), 0);
  EXPECT_EQ(labels.at("nvidia.com/gpu.replicas"), "1");
  EXPECT_EQ(labels.at("nvidia.com/gpu.sharing-strategy"), "none");
  EXPECT_EQ(labels.at("nvidia.com/gpu.sharing"), "none");
  labels =
      gpu_labels(t4, parse_plugin_config(read_text_file(example("tessera-slices.yaml")), "s"), 0);
  EXPECT_EQ(labels.at("nvidia.com/gpu.sharing"), "slices");
  EXPECT_EQ(labels.at("nvidia.com/gpu.product"), "Tesla-T4-SHARED");
  // Every value is one Kubernetes takes.
  Inventory odd = machine(1, "  NVIDIA (R) Weird/GPU  Model++ ");
  odd.driver_version = "580.65.06 (beta)";
  for (const auto& [key, value] : gpu_labels(odd, shared, 0)) {
    EXPECT_LE(value.size(), 63u) << key;
    for (const char c : value)
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')
          << key << "=" << value;
  }
  EXPECT_EQ(product_name("  NVIDIA (R) Weird/GPU  Model++ "), "NVIDIA-R-WeirdGPU-Model");
}

TEST(NodeLabels, TheGpusAnnotationTellsTheSchedulerWhichGpusTakeWhichPods) {
  const Inventory four = machine(4);
  HealthBoard health(4);
  health.record_error(3, "XID 79", HealthBoard::Clock::now());
  const PluginConfig config =
      parse_plugin_config(read_text_file(example("tessera-partly-shared.yaml")), "p");
  const nlohmann::json annotation =
      gpus_annotation(four, build_resource_map(four, config), health, config.strategy());
  ASSERT_EQ(annotation["gpus"].size(), 4u);
  EXPECT_EQ(annotation["gpus"][0]["sharing"], "slices");
  EXPECT_EQ(annotation["gpus"][0]["slices"], 4);
  EXPECT_EQ(annotation["gpus"][2]["sharing"], "none");
  EXPECT_EQ(annotation["gpus"][3]["healthy"], false);
  // The scheduler reads it: slices on GPUs 0 and 1, GPUs 2 and 3 whole-GPU pods only.
  nlohmann::json node = {
      {"metadata",
       {{"name", "gpu-a"}, {"annotations", {{contract::kGpusAnnotation, annotation.dump()}}}}},
      {"status", {{"allocatable", {{"cpu", "32"}, {"memory", "256Gi"}}}}}};
  extender::NodeInfo info = extender::node_from_json(node);
  EXPECT_EQ(info.spec.gpus, 4);
  EXPECT_EQ(info.spec.whole_only_gpus, 0b1100);
  EXPECT_EQ(info.gpu_uuids,
            (std::vector<std::string>{simulated_gpu_uuid(0), simulated_gpu_uuid(1),
                                      simulated_gpu_uuid(2), simulated_gpu_uuid(3)}));
  sched::Cluster cluster({info.spec});
  sched::Request half;
  half.gpus = 1;
  half.gpu_milli = 500;
  for (int i = 0; i < 4; ++i) {
    std::mt19937_64 random(1);
    const sched::Placement placement = cluster.place(half, sched::Policy::fgd, random);
    ASSERT_EQ(placement.node, 0) << "half GPU " << i;
    EXPECT_LT(placement.gpu_index[0], 2) << "a fractional pod on a GPU served whole";
    cluster.allocate(half, placement);
  }
  std::mt19937_64 random(1);
  EXPECT_EQ(cluster.place(half, sched::Policy::fgd, random).node, -1);  // the whole GPUs refuse it
  sched::Request whole;
  whole.gpus = 2;
  whole.gpu_milli = 1000;
  EXPECT_EQ(cluster.place(whole, sched::Policy::fgd, random).node, 0);
  // Time-sliced GPUs are the kubelet's to count: the scheduler leaves them out.
  const PluginConfig sliced_time =
      parse_plugin_config(read_text_file(example("seed-any.yaml")), "any");
  node["metadata"]["annotations"][contract::kGpusAnnotation] =
      gpus_annotation(four, build_resource_map(four, sliced_time), health, sliced_time.strategy())
          .dump();
  EXPECT_EQ(extender::node_from_json(node).spec.gpus, 0);
}

TEST(NodeHealth, WhatMakesAGpuUnhealthyFollowsNvidiasListsAndVariables) {
  const HealthSettings defaults;
  HealthPolicy policy = health_policy(defaults, nullptr, nullptr, std::chrono::seconds(60));
  EXPECT_TRUE(policy.critical(abi::nvmlEventTypeXidCriticalError, 79));
  for (const std::uint64_t xid : {13, 31, 43, 45, 68, 109}) {
    EXPECT_FALSE(policy.critical(abi::nvmlEventTypeXidCriticalError, xid)) << xid;
  }
  EXPECT_TRUE(policy.critical(abi::nvmlEventTypeDoubleBitEccError, 0));
  EXPECT_FALSE(policy.critical(abi::nvmlEventTypeSingleBitEccError, 0));  // corrected
  EXPECT_FALSE(
      health_policy(defaults, "all", nullptr, {}).critical(abi::nvmlEventTypeXidCriticalError, 79));
  EXPECT_FALSE(health_policy(defaults, "xids", nullptr, {}).enabled);
  policy = health_policy(defaults, "79, 94,banana", nullptr, {});
  EXPECT_FALSE(policy.critical(abi::nvmlEventTypeXidCriticalError, 79));
  EXPECT_FALSE(policy.critical(abi::nvmlEventTypeXidCriticalError, 94));
  EXPECT_TRUE(policy.critical(abi::nvmlEventTypeXidCriticalError, 48));
  EXPECT_EQ(policy.notes.size(), 1u);  // banana, said
  EXPECT_TRUE(
      health_policy(defaults, nullptr, "13", {}).critical(abi::nvmlEventTypeXidCriticalError, 13));
  EXPECT_TRUE(
      health_policy(defaults, nullptr, "all", {}).critical(abi::nvmlEventTypeXidCriticalError, 31));
  // NVIDIA's health section.
  const PluginConfig only =
      parse_plugin_config("health: {criticalXIDs: [79, 48], ignoredXIDs: [13]}", "h");
  policy = health_policy(only.health, nullptr, nullptr, {});
  EXPECT_TRUE(policy.critical(abi::nvmlEventTypeXidCriticalError, 79));
  EXPECT_FALSE(policy.critical(abi::nvmlEventTypeXidCriticalError, 92));
  EXPECT_FALSE(health_policy(parse_plugin_config("health: {disabled: true}", "d").health, nullptr,
                             nullptr, {})
                   .critical(abi::nvmlEventTypeXidCriticalError, 79));

  // The board: one error makes a GPU unhealthy; quiet for the period, it recovers.
  HealthBoard board(2);
  const auto start = HealthBoard::Clock::now();
  EXPECT_TRUE(board.record_error(1, "XID 79", start));
  EXPECT_FALSE(board.record_error(1, "XID 79", start + std::chrono::seconds(5)));  // still down
  EXPECT_TRUE(board.healthy(0));
  EXPECT_FALSE(board.recover(std::chrono::seconds(10), start + std::chrono::seconds(14)));
  EXPECT_TRUE(board.recover(std::chrono::seconds(10), start + std::chrono::seconds(15)));
  EXPECT_TRUE(board.healthy(1));
  EXPECT_EQ(board.errors(1), 2u);
  EXPECT_TRUE(board.record_error(-1, "event wait failed", start));  // every GPU
  EXPECT_FALSE(board.healthy(0));
  EXPECT_FALSE(board.recover(std::chrono::seconds(0), start + std::chrono::hours(1)));  // 0: never
  // A GPU held down (it cannot be watched) counts no error and stays down while held.
  HealthBoard held(1);
  EXPECT_TRUE(held.hold_down(0, "cannot be watched", start));
  EXPECT_FALSE(held.hold_down(0, "cannot be watched", start + std::chrono::seconds(20)));
  EXPECT_FALSE(held.recover(std::chrono::seconds(10), start + std::chrono::seconds(25)));
  EXPECT_EQ(held.errors(0), 0u);
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

using namespace tessera::node;

// deploy/ as kubectl would apply it: every document parses, the DaemonSet mounts only
// volumes it declares and runs as the account the RBAC binds, and each config in its
// ConfigMap is one the agent serves.
TEST(NodeDeploy, TheManifestsHoldTogetherAndTheConfigMapHoldsConfigsTheAgentServes) {
  const std::string deploy = std::string(TESSERA_SOURCE_DIR) + "/deploy/";
  for (const auto& entry : fs::directory_iterator(deploy)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    for (const YAML::Node& document : YAML::LoadAllFromFile(entry.path().string())) {
      if (document.IsNull()) continue;  // comments after the last ---
      EXPECT_TRUE(document["apiVersion"] && document["kind"])
          << "a document without apiVersion and kind";
    }
  }
  std::map<std::string, YAML::Node> objects;  // by kind
  for (const YAML::Node& document : YAML::LoadAllFromFile(deploy + "tessera-node.yaml")) {
    objects[document["kind"].as<std::string>()] = document;
  }
  const YAML::Node config_map = objects.at("ConfigMap");
  const YAML::Node daemon_set = objects.at("DaemonSet");
  std::set<std::string> configs;
  for (const auto& item : config_map["data"]) {
    const std::string name = item.first.as<std::string>();
    SCOPED_TRACE(name);
    configs.insert(name);
    const PluginConfig config = parse_plugin_config(item.second.as<std::string>(), name, name);
    EXPECT_NO_THROW(build_resource_map(machine(2), config));
  }
  const YAML::Node pod = daemon_set["spec"]["template"]["spec"];
  EXPECT_EQ(pod["serviceAccountName"].as<std::string>(),
            objects.at("ServiceAccount")["metadata"]["name"].as<std::string>());
  EXPECT_EQ(objects.at("ClusterRoleBinding")["subjects"][0]["name"].as<std::string>(),
            pod["serviceAccountName"].as<std::string>());
  std::set<std::string> volumes;
  for (const auto& volume : pod["volumes"]) {
    volumes.insert(volume["name"].as<std::string>());
    if (volume["configMap"]) {
      EXPECT_EQ(volume["configMap"]["name"].as<std::string>(),
                config_map["metadata"]["name"].as<std::string>());
    }
  }
  const YAML::Node container = pod["containers"][0];
  for (const auto& mount : container["volumeMounts"]) {
    EXPECT_EQ(volumes.count(mount["name"].as<std::string>()), 1u)
        << mount["name"].as<std::string>();
  }
  bool named_config = false;
  for (const auto& word : container["command"]) {
    const std::string argument = word.as<std::string>();
    if (argument.rfind("--config=", 0) == 0) {
      named_config = true;
      EXPECT_EQ(configs.count(argument.substr(9)), 1u)
          << argument << " names no key of the ConfigMap";
    }
  }
  EXPECT_TRUE(named_config);
  // The RBAC lets the agent do what it does: patch its node, read and claim its pods.
  std::set<std::string> granted;
  for (const auto& rule : objects.at("ClusterRole")["rules"]) {
    for (const auto& resource : rule["resources"]) {
      for (const auto& verb : rule["verbs"])
        granted.insert(resource.as<std::string>() + ":" + verb.as<std::string>());
    }
  }
  for (const char* needed :
       {"nodes:get", "nodes:list", "nodes:watch", "nodes:patch", "pods:list", "pods:patch"}) {
    EXPECT_EQ(granted.count(needed), 1u) << needed;
  }
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

using namespace tessera::node;

// Without an API server a slice gets the config's defaults at Allocate, and a GPU left whole
// gets no limits; the container's answer carries the hook, its ledger directory (the ledger
// holds the limits), each device's coordination file and the limits in Tessera's and HAMi's
// variables.
TEST(NodeGrants, WithoutAClusterASliceGetsTheConfigsDefaultsAndAWholeGpuNone) {
  ScratchDirectory scratch;
  const Inventory four = machine(4);
  const PluginConfig config = parse_plugin_config(
      "sharing: {slices: {resources: [{name: nvidia.com/gpu, replicas: 4, devices: [0, 1], "
      "coresPerSlice: 30}]}}",
      "partly");
  const ResourceMap map = build_resource_map(four, config);
  const Resource& gpus = *map.find("nvidia.com/gpu");
  const contract::StateLayout layout(scratch.path());
  ContainerGrants grants(layout, nullptr, "node", nullptr, [](const std::string&) {});
  grants.prepare(four);
  EXPECT_EQ(read_text_file(layout.preload_file()),
            std::string(contract::kContainerHookPath) + "\n");
  EXPECT_FALSE(grants.limits_at_pre_start(gpus));

  const ContainerGrant slice = default_grant(four, gpus, {simulated_gpu_uuid(1) + "::2"});
  EXPECT_EQ(slice.gpus, std::vector<int>{1});
  EXPECT_EQ(slice.memory_bytes, std::vector<std::uint64_t>{(40960ull << 20) / 4});
  EXPECT_EQ(slice.cores, std::vector<int>{30});
  const ContainerGrant whole = default_grant(four, gpus, {simulated_gpu_uuid(3)});
  EXPECT_EQ(whole.gpus, std::vector<int>{3});
  EXPECT_EQ(whole.memory_bytes, std::vector<std::uint64_t>{kUnlimited});
  EXPECT_EQ(whole.cores, std::vector<int>{0});
  EXPECT_THROW(default_grant(four, gpus, {"GPU-forged::0"}), AllocationError);

  HealthBoard health(4);
  const ContainerAllocation answer =
      grants.allocate(four, config, gpus, {simulated_gpu_uuid(1) + "::2"}, health);
  EXPECT_EQ(answer.envs.at(contract::kVisibleDevicesVariable), simulated_gpu_uuid(1));
  EXPECT_EQ(answer.envs.at(contract::kMemoryLimitVariable),
            "0=" + std::to_string((40960ull << 20) / 4));
  EXPECT_EQ(answer.envs.at(std::string(contract::kHamiMemoryLimitVariable) + "_0"), "10240m");
  EXPECT_EQ(answer.envs.at(contract::kCoreLimitVariable), "0=30");
  EXPECT_EQ(answer.envs.at(contract::kLedgerVariable), contract::kContainerLedgerPath);
  std::map<std::string, std::pair<std::string, bool>> mounts;
  for (const MountSpec& mount : answer.mounts)
    mounts[mount.container_path] = {mount.host_path, mount.read_only};
  EXPECT_EQ(mounts.at(contract::kContainerPreloadPath),
            std::make_pair(layout.preload_file(), true));
  EXPECT_EQ(mounts.at(contract::kContainerHookPath), std::make_pair(layout.hook_library(), true));
  contract::DeviceKey key;
  ASSERT_TRUE(contract::device_key_from_uuid(simulated_gpu_uuid(1).c_str(), key));
  EXPECT_EQ(mounts.at(contract::container_coordination_file(key)),
            std::make_pair(layout.coordination_file(key), false))
      << "the device's one coordination file, shared by every container on it";
  EXPECT_TRUE(fs::exists(layout.coordination_file(key)));
  const std::string directory = mounts.at(contract::kContainerGroupDirectory).first;
  EXPECT_FALSE(mounts.at(contract::kContainerGroupDirectory).second);
  EXPECT_TRUE(fs::exists(directory + "/" + contract::kCoordinationDirectoryName + "/" + key.text +
                         contract::kCoordinationSuffix))
      << "its mount point";
  ledger::Ledger ledger;
  ErrorText error;
  ASSERT_TRUE(ledger.open((directory + "/" + contract::kLedgerFileName).c_str(), error))
      << error.text;
  EXPECT_EQ(ledger.usage(0).limit, (40960ull << 20) / 4);
  EXPECT_EQ(ledger.usage(0).cores, 30u);
  // A slice on a failed GPU is refused with the reason.
  health.record_error(1, "XID 79", HealthBoard::Clock::now());
  try {
    grants.allocate(four, config, gpus, {simulated_gpu_uuid(1) + "::3"}, health);
    ADD_FAILURE() << "a slice on an unhealthy GPU was granted";
  } catch (const AllocationError& refused) {
    EXPECT_NE(std::string(refused.what()).find("is unhealthy (XID 79)"), std::string::npos)
        << refused.what();
  }
}

// A pod's container gets its own limits: its memory in MiB, else a percentage of each GPU,
// else the scheduler's share; its cores; whole GPUs for a count alone; gpushare's GiB; and its
// priority from HAMi's nvidia.com/priority or tessera.io/priority, HAMi's default (low) else.
TEST(NodeGrants, APodsContainerGetsItsOwnLimitsAndPriority) {
  const Inventory two = machine(2);
  const std::uint64_t total = 40960ull << 20;
  auto pod_with = [](const std::string& limits, const std::string& annotations = "{}") {
    return kube::pod_from_json(nlohmann::json::parse(
        R"({"metadata": {"name": "p", "namespace": "ml", "annotations": )" + annotations +
        R"(}, "spec": {"containers": [{"name": "a", "resources": {"limits": )" + limits +
        R"(}}, {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})"));
  };
  const kube::PodRequest memory = pod_with(
      R"({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 40,
          "nvidia.com/priority": 0})");
  const ContainerGrant first = pod_grant(two, {1}, memory, memory.containers[0], 500);
  EXPECT_EQ(first.memory_bytes, std::vector<std::uint64_t>{3000ull << 20});
  EXPECT_EQ(first.cores, std::vector<int>{40});
  EXPECT_EQ(first.priority, Priority::high);
  // Its neighbour in the pod asks for a GPU alone: the whole GPU, HAMi's default priority.
  const ContainerGrant second = pod_grant(two, {0}, memory, memory.containers[1], 500);
  EXPECT_EQ(second.memory_bytes, std::vector<std::uint64_t>{kUnlimited});
  EXPECT_EQ(second.priority, Priority::low);
  const std::string priority_high = nlohmann::json{{contract::kPriorityAnnotation, "high"}}.dump();
  const std::string priority_low = nlohmann::json{{contract::kPriorityAnnotation, "low"}}.dump();
  const kube::PodRequest percent =
      pod_with(R"({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25})", priority_high);
  const ContainerGrant quarter = pod_grant(two, {0}, percent, percent.containers[0], 0);
  EXPECT_EQ(quarter.memory_bytes, std::vector<std::uint64_t>{total / 100 * 25});
  EXPECT_EQ(quarter.priority, Priority::high);
  const kube::PodRequest cores = pod_with(R"({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30})");
  EXPECT_EQ(pod_grant(two, {0}, cores, cores.containers[0], 300).memory_bytes,
            std::vector<std::uint64_t>{total / 1000 * 300})
      << "the scheduler's share";
  // Both sources: the lower wins.
  const kube::PodRequest both =
      pod_with(R"({"nvidia.com/gpu": 1, "nvidia.com/priority": 0})", priority_low);
  EXPECT_EQ(pod_grant(two, {0}, both, both.containers[0], 0).priority, Priority::low);
  const kube::PodRequest gpushare = kube::pod_from_json(nlohmann::json::parse(
      R"({"metadata": {"name": "g"}, "spec": {"containers": [{"name": "c",
          "resources": {"limits": {"aliyun.com/gpu-mem": 4}}}]}})"));
  EXPECT_EQ(gpushare.gpus, 1);
  EXPECT_EQ(gpushare.gpumem_mib, 4096);
  EXPECT_EQ(pod_grant(two, {1}, gpushare, gpushare.containers[0], 0).memory_bytes,
            std::vector<std::uint64_t>{4ull << 30});
  EXPECT_THROW(pod_with(R"({"nvidia.com/gpu": 1})",
                        nlohmann::json{{contract::kPriorityAnnotation, "urgent"}}.dump()),
               std::runtime_error);
}

// The scheduler names a pod's GPUs by UUID where it can, else by its numbering; a GPU not on
// this node names none.
TEST(NodeGrants, AnAssignmentsGpusAreFoundByUuidElseByTheSchedulersNumbering) {
  const Inventory four = machine(4);
  kube::RecordedAssignment record{"node", {1, 0}, {}, 250};
  const std::vector<std::string> numbering = {simulated_gpu_uuid(2), simulated_gpu_uuid(3)};
  EXPECT_EQ(assigned_gpus(four, record, numbering, 0, 2), (std::vector<int>{3, 2}));
  EXPECT_EQ(assigned_gpus(four, record, numbering, 1, 1), (std::vector<int>{2}));
  EXPECT_TRUE(assigned_gpus(four, record, numbering, 1, 2).empty()) << "past its GPUs";
  record.uuids = {simulated_gpu_uuid(0), simulated_gpu_uuid(1)};
  EXPECT_EQ(assigned_gpus(four, record, numbering, 0, 2), (std::vector<int>{0, 1}));
  record.uuids[1] = "GPU-elsewhere";
  EXPECT_TRUE(assigned_gpus(four, record, numbering, 0, 2).empty());
}

// A container's GPUs in its pod's assignment: slices follow the containers before it; gpushare's
// containers all have the pod's one GPU.
TEST(NodeGrants, AContainersPlaceInItsPodsAssignmentFollowsTheContainersBeforeIt) {
  // Each container's {asks, offset, count} for a pod with these containers.
  const auto places = [](ResourceKind kind, const std::string& containers) {
    Resource resource;
    resource.kind = kind;
    const kube::PodRequest pod = kube::pod_from_json(nlohmann::json::parse(
        R"({"metadata": {"name": "p"}, "spec": {"containers": )" + containers + "}}"));
    std::vector<std::vector<int>> found;
    for (const AssignedPlace& place : assigned_places(resource, pod)) {
      found.push_back({place.asks, place.offset, place.count});
    }
    return found;
  };
  EXPECT_EQ(places(ResourceKind::slices,
                   R"([{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 2}}},
                       {"name": "none"},
                       {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1}}}])"),
            (std::vector<std::vector<int>>{{2, 0, 2}, {0, 2, 0}, {1, 2, 1}}));
  EXPECT_EQ(places(ResourceKind::gpushare,
                   R"([{"name": "a", "resources": {"limits": {"aliyun.com/gpu-mem": 3}}},
                       {"name": "b", "resources": {"limits": {"aliyun.com/gpu-mem": 5}}}])"),
            (std::vector<std::vector<int>>{{3, 0, 1}, {5, 0, 1}}));
}

}  // namespace
}  // namespace tessera::test
