// Every pod spec of the two documents Tessera grew from, unchanged (tests/data/seeds): each is
// placed by tessera scheduler (filter, prioritize and bind, as kube-scheduler calls it, among
// the nodes its node affinity allows) and admitted by the kubelet from tessera node, and its
// container gets what the pod asked for. NVIDIA's time-sliced GPUs and MIG devices, HAMi's
// slices with memory and cores, and gpushare's GiB of a GPU, each on a node configured as the
// documents configure theirs.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "contract/annotations.h"
#include "contract/layout.h"
#include "contract/variables.h"
#include "kube/objects.h"
#include "ledger/ledger.h"
#include "node_process.h"
#include "yaml_json.h"

namespace tessera::test {
namespace {

using namespace std::chrono_literals;

// The seeds' pods by name; a Deployment's or a Job's is its template, named after it.
std::map<std::string, nlohmann::json> seed_pods() {
  std::map<std::string, nlohmann::json> pods;
  for (const char* file : {"time-slicing-article.yaml", "gpu-sharing-chapter.yaml"}) {
    for (const YAML::Node& document :
         YAML::LoadAllFromFile(std::string(TESSERA_SOURCE_DIR) + "/tests/data/seeds/" + file)) {
      nlohmann::json object = to_json(document);
      const std::string name = object["metadata"]["name"];
      if (object["kind"] != "Pod") {
        nlohmann::json pod{{"apiVersion", "v1"}, {"kind", "Pod"}};
        pod["metadata"] = object["spec"]["template"].value("metadata", nlohmann::json::object());
        pod["metadata"]["name"] = name;
        pod["spec"] = object["spec"]["template"]["spec"];
        object = pod;
      }
      object["metadata"]["namespace"] = "default";
      object["status"] = {{"phase", "Pending"}};
      pods[name] = object;
    }
  }
  return pods;
}

// Whether a node's labels satisfy a pod's required node affinity (the operators the seeds use).
bool affinity_allows(const nlohmann::json& pod, const nlohmann::json& labels) {
  const nlohmann::json::json_pointer terms(
      "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/"
      "nodeSelectorTerms");
  if (!pod.contains(terms)) return true;
  for (const nlohmann::json& term : pod[terms]) {
    bool all = true;
    for (const nlohmann::json& expression : term["matchExpressions"]) {
      const std::string key = expression["key"];
      const std::string value = labels.value(key, std::string());
      const auto& values = expression["values"];
      EXPECT_EQ(expression["operator"], "In");
      all = all && std::find(values.begin(), values.end(), value) != values.end();
    }
    if (all) return true;
  }
  return false;
}

// A GPU node as the documents configure theirs, with its kubelet.
struct SeedNode {
  SeedNode(const std::string& node_name, const std::string& devices, const std::string& config,
           FakeCluster& cluster, const std::function<void(const Environment&)>& prepare = {})
      : name(node_name),
        kubelet(scratch.file("dp")),
        env(machine(scratch, devices, {{"TESSERA_SIMULATE", "1"}})) {
    if (prepare) prepare(env);
    cluster.put("nodes", cluster_node(name));
    std::ofstream(scratch.file("config.yaml")) << config;
    process = std::make_unique<NodeProcess>(
        scratch,
        std::vector<std::string>{"--config-file", scratch.file("config.yaml"), "--api-server",
                                 cluster.url()},
        env, name);
    EXPECT_TRUE(process->started()) << process->log();
    EXPECT_TRUE(cluster.wait_for(
        "nodes", name,
        [](const nlohmann::json& object) {
          return object["metadata"]["annotations"].contains(contract::kGpusAnnotation) &&
                 object["metadata"]["labels"].contains("nvidia.com/gpu.sharing");
        },
        10s))
        << process->log();
  }
  std::string name;
  ScratchDirectory scratch;
  TestKubelet kubelet;
  Environment env;
  std::unique_ptr<NodeProcess> process;
};

TEST(SeedPods, EveryPodSpecOfTheSeedsIsPlacedAndGetsWhatItAsks) {
  FakeCluster cluster;
  const std::string time_slicing = read_text_file(example("seed-chapter-time-slicing.yaml"));
  SeedNode sliced_in_time("ts-node", kTwoGpus, time_slicing, cluster);
  SeedNode mig_node(
      "mig-node", "A100-80GB", "version: v1\nflags:\n  migStrategy: mixed\n", cluster,
      [](const Environment& env) {
        const std::vector<std::string> apply = {
            tessera(),
            "mig",
            "apply",
            "-f",
            std::string(TESSERA_SOURCE_DIR) + "/examples/mig/seed-chapter-mig-parted.yaml",
            "-c",
            "mixed"};
        ASSERT_EQ(run(apply, env).exit_code, 3);  // MIG on waits for a reset
        ASSERT_EQ(run({tessera(), "simgpu", "reset", "--device", "0"}, env).exit_code, 0);
        ASSERT_EQ(run(apply, env).exit_code, 0);
      });
  // Room enough for every pod wherever the scheduler puts those that may go anywhere.
  SeedNode slices_node("slices-node", "H100;H100;H100;H100",
                       "version: v1\nsharing:\n  slices:\n    gpushare: true\n    resources:\n"
                       "    - name: nvidia.com/gpu\n      replicas: 4\n",
                       cluster);
  SeedNode whole_node("whole-node", "H100;H100;H100;H100;H100;H100;H100;H100", "version: v1\n",
                      cluster);
  std::map<std::string, SeedNode*> nodes = {{sliced_in_time.name, &sliced_in_time},
                                            {mig_node.name, &mig_node},
                                            {slices_node.name, &slices_node},
                                            {whole_node.name, &whole_node}};
  SchedulerProcess scheduler(cluster, sliced_in_time.env);

  // The nodes the documents meant for the pods that say so (their node affinity).
  const std::map<std::string, std::string> meant = {
      {"dev-pod", "ts-node"}, {"inference-pod", "mig-node"}, {"training-job", "whole-node"}};
  const std::map<std::string, nlohmann::json> pods = seed_pods();
  ASSERT_EQ(pods.size(), 11u) << "every seed pod spec, once";
  for (const auto& [name, object] : pods) {
    SCOPED_TRACE(name);
    cluster.put("pods", object);
    // kube-scheduler's own filters first: the pod's node affinity, on the labels tessera node
    // wrote, and whether the node serves every device resource it asks; then the extender's.
    const TestKubelet::PodSpec spec = kubelet_pod(object);
    std::vector<std::string> candidates;
    for (const auto& [node_name, node] : nodes) {
      const std::vector<std::string> served = node->kubelet.resources();
      bool fits =
          affinity_allows(object, cluster.get("nodes", node_name)->at("metadata").at("labels"));
      for (const auto& container : spec.containers) {
        for (const auto& [resource, count] : container.devices) {
          fits = fits && std::find(served.begin(), served.end(), resource) != served.end();
        }
      }
      if (fits) candidates.push_back(node_name);
    }
    if (meant.contains(name)) {
      EXPECT_EQ(candidates, std::vector<std::string>{meant.at(name)});
    }
    std::string why;
    const std::string bound =
        scheduler.schedule(*cluster.get("pods", "default/" + name), candidates, why);
    ASSERT_FALSE(bound.empty()) << why;
    SeedNode& node = *nodes.at(bound);
    const nlohmann::json pod = *cluster.get("pods", "default/" + name);
    std::vector<TestKubelet::AdmittedContainer> admitted;
    const grpc::Status status = node.kubelet.admit(kubelet_pod(pod), admitted);
    ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << node.process->log();
    ASSERT_TRUE(node.kubelet.start("default", name, spec.containers.front().name).ok())
        << node.process->log();
    const ContainerSpec container = container_spec(admitted.front());
    const std::string visible = container.envs.at(contract::kVisibleDevicesVariable);
    auto ledger_limits = [&](std::uint64_t& memory, std::uint32_t& cores) {
      ledger::Ledger ledger;
      ErrorText error;
      for (const ContainerSpec::Mount& mount : container.mounts) {
        if (mount.container != contract::kContainerGroupDirectory) continue;
        ASSERT_TRUE(ledger.open((mount.host + "/" + contract::kLedgerFileName).c_str(), error))
            << error.text;
        memory = ledger.usage(0).limit;
        cores = ledger.usage(0).cores;
        return;
      }
      ADD_FAILURE() << "no ledger given";
    };
    if (bound == "ts-node") {  // NVIDIA's replica of a GPU, no limits
      EXPECT_EQ(visible.rfind("GPU-", 0), 0u) << visible;
      EXPECT_NE(admitted.front().devices.at("nvidia.com/gpu").front().find("::"),
                std::string::npos);
      EXPECT_EQ(container.envs.count(contract::kLedgerVariable), 0u);
    } else if (bound == "mig-node") {  // its MIG device
      EXPECT_EQ(visible.rfind("MIG-", 0), 0u) << visible;
    } else if (name == "hami-pod") {  // HAMi's slice: 4096 MiB, 50 % of the GPU
      std::uint64_t memory = 0;
      std::uint32_t cores = 0;
      ledger_limits(memory, cores);
      EXPECT_EQ(memory, 4096ull << 20);
      EXPECT_EQ(cores, 50u);
    } else if (name == "gpushare-pod") {  // gpushare's 4 GiB, its variables, held by Tessera
      std::uint64_t memory = 0;
      std::uint32_t cores = 0;
      ledger_limits(memory, cores);
      EXPECT_EQ(memory, 4ull << 30);
      EXPECT_EQ(cores, 0u);
      EXPECT_EQ(container.envs.at(contract::kGpushareContainerVariable), "4");
      EXPECT_EQ(container.envs.at(contract::kGpusharePodVariable), "4");
      EXPECT_EQ(container.envs.at(contract::kGpushareDeviceVariable), "79");  // an H100's GiB
      const kube::RecordedAssignment record = kube::assignment_from_annotation(
          pod["metadata"]["annotations"][contract::kAssignmentAnnotation]);
      EXPECT_EQ(container.envs.at(contract::kGpushareIndexVariable),
                std::to_string(record.gpus.at(0)));
      EXPECT_EQ(visible, simulated_gpu_uuid(record.gpus.at(0)));
      // Tessera holds the container to it, which gpushare never did.
      const Finished filled = run(
          in_container(node.scratch, container, {worker(), "fill", std::to_string(64ull << 20)}),
          node.env);
      EXPECT_EQ(filled.number("total"), 4ull << 30) << filled.err;
      EXPECT_EQ(filled.number("error"), 2u) << "out of memory past its 4 GiB";
    } else if (name == "training-job") {  // its four whole GPUs
      EXPECT_EQ(std::count(visible.begin(), visible.end(), ','), 3) << visible;
    } else {  // a GPU of its own, whole (a slices GPU's, held whole)
      EXPECT_EQ(visible.rfind("GPU-", 0), 0u) << visible;
      EXPECT_EQ(visible.find(','), std::string::npos) << visible;
    }
    std::printf("%s: placed on %s, given %s\n", name.c_str(), bound.c_str(), visible.c_str());
  }
}

}  // namespace
}  // namespace tessera::test
