// The resources and device IDs a config gives: shared and whole GPUs, MPS, MIG strategies.
#include "node_fixtures.h"

namespace tessera::test {
namespace {

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

}  // namespace
}  // namespace tessera::test
