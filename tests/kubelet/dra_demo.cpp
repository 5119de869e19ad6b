// test-dra: the DRA side of a node for the demo and for trying tessera node --dra by hand. It
// serves a fake API server on loopback, starts the command after `--` with --api-server set to
// it (a tessera node --dra), registers its plugin as the kubelet would, prints the devices its
// ResourceSlices publish, then creates a claim for a shared slice (4Gi, 30 cores, priority
// high) as kube-scheduler would have allocated it, prepares it, prints the CDI spec it got,
// and unprepares it.
//
//   test-dra REGISTRY_DIR -- tessera node --dra [FLAGS...]
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fake_cluster.h"
// gRPC's Abseil after Tessera's lock annotations (fake_cluster.h).
#include "dra_kubelet.h"

extern char** environ;

namespace {

using nlohmann::json;

constexpr const char* kDriver = "gpu.tessera.io";

int fail(const std::string& why) {
  std::fprintf(stderr, "test-dra: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || std::string(argv[2]) != "--") {
    std::fprintf(stderr, "usage: test-dra REGISTRY_DIR -- COMMAND [ARGS...]\n");
    return 2;
  }
  tessera::test::FakeCluster cluster;
  cluster.put("nodes", tessera::test::cluster_node("demo-node"));
  std::vector<std::string> words(argv + 3, argv + argc);
  words.insert(words.end(), {"--api-server", cluster.url(), "--node-name", "demo-node"});
  std::vector<char*> args;
  for (std::string& word : words) args.push_back(word.data());
  args.push_back(nullptr);
  pid_t node = -1;
  if (posix_spawn(&node, args[0], nullptr, nullptr, args.data(), environ) != 0) {
    return fail("cannot start " + words[0]);
  }
  auto finish = [node](int status) {
    kill(node, SIGTERM);
    waitpid(node, nullptr, 0);
    return status;
  };

  tessera::test::DraKubelet kubelet(argv[1]);
  std::string why;
  if (!kubelet.register_plugin(kDriver, std::chrono::seconds(20), why)) return finish(fail(why));
  std::printf("kubelet: registered DRA plugin %s at %s\n", kubelet.info().name().c_str(),
              kubelet.info().endpoint().c_str());
  json slices;
  for (int tries = 0; tries < 200; ++tries) {
    slices = json::parse(
        cluster.list_resource_slices(kDriver, "demo-node", tessera::kube::Deadline::max())
            .body)["items"];
    if (!slices.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::map<std::string, int> by_type;
  for (const json& slice : slices) {
    for (const json& device : slice["spec"].value("devices", json::array())) {
      ++by_type[device["attributes"]["type"]["string"].get<std::string>()];
    }
  }
  std::printf("api server: %zu ResourceSlices:", slices.size());
  for (const auto& [type, count] : by_type) std::printf(" %d %s", count, type.c_str());
  std::printf(" device(s)\n");

  const std::string uid = "de000000-0000-4000-8000-000000000001";
  cluster.put("resourceclaims",
              {{"apiVersion", "resource.k8s.io/v1"},
               {"kind", "ResourceClaim"},
               {"metadata", {{"name", "inference-gpu"}, {"namespace", "default"}, {"uid", uid}}},
               {"status",
                {{"allocation",
                  {{"devices",
                    {{"results",
                      json::array({{{"request", "gpu"},
                                    {"driver", kDriver},
                                    {"pool", "demo-node"},
                                    {"device", "gpu-0-shared"},
                                    {"consumedCapacity", {{"memory", "4Gi"}, {"cores", "30"}}}}})},
                     {"config", json::array({{{"source", "FromClaim"},
                                              {"opaque",
                                               {{"driver", kDriver},
                                                {"parameters",
                                                 {{"apiVersion", "gpu.tessera.io/v1alpha1"},
                                                  {"kind", "GpuSharing"},
                                                  {"priority", "high"}}}}}}})}}}}}}}});
  k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse prepared;
  const grpc::Status status = kubelet.prepare({{"default", uid, "inference-gpu"}}, prepared);
  if (!status.ok()) return finish(fail("NodePrepareResources: " + status.error_message()));
  const auto& answer = prepared.claims().at(uid);
  if (!answer.error().empty()) return finish(fail("claim refused: " + answer.error()));
  for (const auto& device : answer.devices()) {
    std::printf("kubelet: prepared claim default/inference-gpu: %s/%s -> %s\n",
                device.pool_name().c_str(), device.device_name().c_str(),
                device.cdi_device_ids(0).c_str());
  }
  k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse unprepared;
  if (!kubelet.unprepare({{"default", uid, "inference-gpu"}}, unprepared).ok() ||
      !unprepared.claims().at(uid).error().empty()) {
    return finish(fail("NodeUnprepareResources failed"));
  }
  std::printf("kubelet: unprepared claim default/inference-gpu\n");
  return finish(0);
}
