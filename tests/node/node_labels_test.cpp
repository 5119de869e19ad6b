// GFD's labels and the tessera.io/gpus annotation the scheduler places by.
#include "node_fixtures.h"

namespace tessera::test {
namespace {

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

}  // namespace
}  // namespace tessera::test
