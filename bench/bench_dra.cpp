// bench_dra: how fast the DRA driver answers NodePrepareResources, measured as the kubelet
// sees it: over real gRPC on a unix socket (the test kubelet's DRA side), the claim read over
// real HTTP from the fake API server, the claim's ledger, CDI spec and checkpoint written to
// disk. Beside it, in the same run, the baseline the call cannot beat: the claim's GET from the
// API server alone. Every prepared claim is unprepared (timed too) before the next, so the
// node never fills. Medians, p99 and ratios.
//
//   bench_dra [CALLS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "contract/dra.h"
#include "contract/host_layout.h"
#include "fake_cluster.h"
// gRPC's Abseil after Tessera's lock annotations (fake_cluster.h).
#include "dra/driver.h"
#include "dra/plugin_server.h"
#include "dra_kubelet.h"
#include "kube/api_cluster.h"
#include "latency.h"
#include "node/config.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using namespace tessera;

using tessera::bench::micros;
using tessera::bench::percentile;

node::Inventory machine() {
  node::Inventory inventory;
  inventory.driver_version = "580.65.06";
  for (unsigned i = 0; i < 8; ++i) {
    node::GpuInfo gpu;
    gpu.index = i;
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-7e55e7a0-0000-4000-8000-%012x", i);
    gpu.uuid = uuid;
    gpu.name = "NVIDIA H100 80GB HBM3";
    gpu.memory_bytes = 81559ull << 20;
    gpu.cc_major = 9;
    gpu.mig_capable = true;
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

json claim(const std::string& uid, int gpu) {
  json result = {{"request", "gpu"},
                 {"driver", contract::kDraDriverName},
                 {"pool", "gpu-node"},
                 {"device", "gpu-" + std::to_string(gpu) + "-shared"},
                 {"consumedCapacity", {{"memory", "4Gi"}, {"cores", "30"}}}};
  json config = {{"source", "FromClaim"},
                 {"opaque",
                  {{"driver", contract::kDraDriverName},
                   {"parameters",
                    {{"apiVersion", contract::kDraConfigApiVersion},
                     {"kind", contract::kDraConfigKind},
                     {"priority", "high"}}}}}};
  return {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata",
       {{"name", "claim-" + uid.substr(uid.size() - 6)}, {"namespace", "default"}, {"uid", uid}}},
      {"status",
       {{"allocation",
         {{"devices", {{"results", json::array({result})}, {"config", json::array({config})}}}}}}}};
}

void print(const char* name, const std::vector<double>& us, double base) {
  const double median = percentile(us, 0.5), p99 = percentile(us, 0.99);
  std::printf("%-40s %6zu calls  p50 %8.1f us  p99 %8.1f us  p50 / baseline %5.2fx\n", name,
              us.size(), median, p99, base > 0 ? median / base : 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::max(10, std::atoi(argv[1])) : 2000;
  const fs::path scratch = fs::temp_directory_path() / ("bench_dra." + std::to_string(getpid()));
  fs::create_directories(scratch);

  test::FakeCluster cluster;
  kube::ApiClientOptions api;
  api.server = cluster.url();
  const kube::ApiCluster client(api);
  const node::Inventory inventory = machine();
  node::HealthBoard health(static_cast<int>(inventory.gpus.size()));
  node::ContainerGrants grants(contract::StateLayout((scratch / "state").string()), &client,
                               "gpu-node", nullptr, nullptr);
  grants.prepare(inventory);
  dra::DraDriver driver(
      {contract::kDraDriverName, "gpu-node", (scratch / "cdi").string(),
       (scratch / "state/dra/claims").string()},
      inventory, health, grants, client, [] { return node::default_plugin_config(); }, nullptr);
  driver.restore();
  dra::DraPluginServer server(contract::kDraDriverName, (scratch / "registry").string(),
                              (scratch / "plugins").string(), driver, nullptr);
  server.start();
  test::DraKubelet kubelet((scratch / "registry").string());
  std::string why;
  if (!kubelet.register_plugin(contract::kDraDriverName, std::chrono::seconds(10), why)) {
    std::fprintf(stderr, "registration failed: %s\n", why.c_str());
    return 1;
  }

  std::vector<double> get_us, prepare_us, retry_us, unprepare_us;
  for (int i = 0; i < calls; ++i) {
    char uid[64];
    std::snprintf(uid, sizeof uid, "b0b0b0b0-0000-4000-8000-%012x", i);
    cluster.put("resourceclaims", claim(uid, i % 8));
    const kube::ObjectName name{"default", std::string("claim-") + (uid + 30)};
    auto start = Clock::now();
    if (client.get_resource_claim(name, kube::Deadline::max()).status != 200) return 1;
    get_us.push_back(micros(Clock::now() - start));

    const test::DraKubelet::Claim asked{"default", uid, name.name};
    k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse prepared;
    start = Clock::now();
    const grpc::Status status = kubelet.prepare({asked}, prepared);
    prepare_us.push_back(micros(Clock::now() - start));
    if (!status.ok() || !prepared.claims().at(uid).error().empty()) {
      std::fprintf(stderr, "prepare failed: %s %s\n", status.error_message().c_str(),
                   prepared.claims().at(uid).error().c_str());
      return 1;
    }
    start = Clock::now();
    if (!kubelet.prepare({asked}, prepared).ok()) return 1;
    retry_us.push_back(micros(Clock::now() - start));
    k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse unprepared;
    start = Clock::now();
    if (!kubelet.unprepare({asked}, unprepared).ok() ||
        !unprepared.claims().at(uid).error().empty()) {
      return 1;
    }
    unprepare_us.push_back(micros(Clock::now() - start));
    cluster.remove("resourceclaims", "default/" + name.name);
  }
  server.stop();
  std::printf(
      "DRA NodePrepareResources through the test kubelet (gRPC), the fake API server (HTTP)\n");
  const double base = percentile(get_us, 0.5);
  print("GET the claim (baseline)", get_us, base);
  print("NodePrepareResources, shared claim", prepare_us, base);
  print("NodePrepareResources, retried", retry_us, base);
  print("NodeUnprepareResources", unprepare_us, base);
  fs::remove_all(scratch);
  return percentile(prepare_us, 0.99) < 5000 ? 0 : 2;
}
