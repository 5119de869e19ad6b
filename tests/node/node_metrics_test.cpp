// The node agent's /metrics: every family declared once with its help and type, GPU series with
// dcgm-exporter's labels, outside text escaped, and nothing of containers where there are none.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include "contract/host_layout.h"
#include "node/metrics.h"
#include "support.h"

namespace tessera::test {
namespace {

using namespace tessera::node;

// Each series line, by name and labels, with its value.
std::map<std::string, std::string> series_of(const std::string& text) {
  std::map<std::string, std::string> series;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t space = line.rfind(' ');
    series[line.substr(0, space)] = line.substr(space + 1);
  }
  return series;
}

TEST(NodeMetrics, GpusHealthAndResourcesAreSeriesWithTheirLabels) {
  ScratchDirectory scratch;
  MetricsRenderer renderer{contract::StateLayout(scratch.path())};
  Inventory inventory;
  for (unsigned i = 0; i < 2; ++i) {
    GpuInfo gpu;
    gpu.index = i;
    gpu.uuid = "GPU-" + std::to_string(i);
    gpu.name = "NVIDIA \"H100\"";  // a quote in outside text is escaped
    gpu.memory_bytes = 80ull << 30;
    inventory.gpus.push_back(gpu);
  }
  HealthBoard health(2);
  health.record_error(1, "XID 79", HealthBoard::Clock::now());
  AgentStatus status;
  status.hostname = "node-1";
  status.inventory = &inventory;
  status.health = &health;
  status.xids = {{79, 1}};
  status.resources["nvidia.com/gpu"] = {3, 1, 2, 1};
  status.config_generation = 2;
  status.config_name = "default";
  const std::string text = renderer.render(status);
  const auto series = series_of(text);

  const std::string gpu1 = R"(gpu="1",UUID="GPU-1",modelName="NVIDIA \"H100\"",Hostname="node-1")";
  EXPECT_EQ(series.at("tessera_gpu_healthy{" + gpu1 + "}"), "0");
  EXPECT_EQ(series.at("tessera_gpu_health_errors_total{" + gpu1 + "}"), "1");
  EXPECT_EQ(
      series.at(
          R"(tessera_gpu_healthy{gpu="0",UUID="GPU-0",modelName="NVIDIA \"H100\"",Hostname="node-1"})"),
      "1");
  EXPECT_EQ(series.at(R"(tessera_xid_events_total{xid="79",Hostname="node-1"})"), "1");
  EXPECT_EQ(series.at(R"(tessera_allocations_total{resource="nvidia.com/gpu"})"), "3");
  EXPECT_EQ(
      series.at(R"(tessera_advertised_devices{resource="nvidia.com/gpu",health="Unhealthy"})"),
      "1");
  EXPECT_EQ(series.at(R"(tessera_config_info{config="default",refused="0"})"), "1");
  EXPECT_EQ(series.at("tessera_config_generation"), "2");
  // Every family is declared once, before its samples; no container series without containers.
  std::map<std::string, int> declared;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) == 0) ++declared[line.substr(7, line.find(' ', 7) - 7)];
  }
  for (const auto& [family, times] : declared) EXPECT_EQ(times, 1) << family;
  for (const auto& [name, value] : series) {
    const std::string family = name.substr(0, name.find('{'));
    EXPECT_EQ(declared.count(family), 1u) << name;
    EXPECT_NE(family.rfind("tessera_container_", 0), 0u) << name;
  }
}

}  // namespace
}  // namespace tessera::test
