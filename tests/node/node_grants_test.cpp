// What each container is granted: limits, priority, coordination files, assignments.
#include "node_fixtures.h"

namespace tessera::test {
namespace {

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
