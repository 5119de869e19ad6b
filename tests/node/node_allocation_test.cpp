// The devices the kubelet is told to prefer and a container is given, per device-list strategy.
#include "node_fixtures.h"

namespace tessera::test {
namespace {

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

}  // namespace
}  // namespace tessera::test
