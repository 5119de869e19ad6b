// The node agent in process, its threads at work together: config reloads, health events
// from the simulated GPU, Allocate and ListAndWatch's lists, and metrics, all at once. Under
// `make tsan` this is where races in the agent's own state would show (the gRPC-level tests
// run under the release and ASan builds: Debian's gRPC is not built for TSan).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "contract/variables.h"
#include "node/agent.h"
#include "support.h"

namespace tessera::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string replicas(int count) {
  return "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
         "      replicas: " +
         std::to_string(count) + "\n";
}

TEST(NodeAgentThreads, ReloadsHealthEventsAllocateListsAndMetricsRunTogether) {
  ScratchDirectory scratch;
  setenv("TESSERA_SIM_DEVICES", "H100,context=0;H100,context=0", 1);
  setenv("TESSERA_SIM_STATE", scratch.file("sim").c_str(), 1);
  const std::string config = scratch.file("config.yaml");
  std::ofstream(config) << replicas(4);
  node::NodeAgentOptions options;
  options.node_name = "threads";
  options.nvml_library = build_path("sim/libnvidia-ml.so.1");
  options.device_plugin_dir = scratch.file("dp");  // no kubelet: registration keeps retrying
  options.state_dir = scratch.file("state");
  options.config_file = config;
  options.recovery_quiet = 50ms;
  node::NodeAgent agent(std::move(options));
  agent.start();

  void* nvml = dlopen(build_path("sim/libnvidia-ml.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(nvml, nullptr);
  auto raise_event = reinterpret_cast<int (*)(unsigned, unsigned long long, unsigned long long)>(
      dlsym(nvml, "tesseraSimRaiseEvent"));
  ASSERT_NE(raise_event, nullptr);

  const auto until = Clock::now() + 1500ms;
  std::atomic<int> allocations{0}, failures{0}, lists{0}, reloads{0}, events{0}, scrapes{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {  // the operator edits the config, between 2 and 8 replicas
    for (int i = 0; Clock::now() < until; ++i) {
      const std::string next = config + ".next";
      std::ofstream(next) << replicas(2 + i % 7);
      std::filesystem::rename(next, config);
      failures += !agent.reload();
      ++reloads;
    }
  });
  threads.emplace_back([&] {  // GPUs fail and recover
    for (int i = 0; Clock::now() < until; ++i) {
      raise_event(static_cast<unsigned>(i % 2), 0x8, i % 3 == 0 ? 13 : 79);
      ++events;
      std::this_thread::sleep_for(5ms);  // pacing the events, not waiting for anything
    }
  });
  for (int worker = 0; worker < 2; ++worker) {
    threads.emplace_back([&, worker] {  // the kubelet allocates, a device every config has
      while (Clock::now() < until) {
        try {
          const node::ContainerAllocation answer =
              agent.allocate("nvidia.com/gpu", {simulated_gpu_uuid(worker) + "::1"});
          failures +=
              answer.envs.at(contract::kVisibleDevicesVariable) != simulated_gpu_uuid(worker);
        } catch (const std::exception&) {
          ++failures;
        }
        ++allocations;
      }
    });
  }
  threads.emplace_back([&] {  // ListAndWatch's lists: each a whole config's, never a mix
    while (Clock::now() < until) {
      const auto devices = agent.devices_of("nvidia.com/gpu");
      failures += devices.empty() || devices.size() % 2 != 0;
      ++lists;
    }
  });
  threads.emplace_back([&] {  // Prometheus scrapes
    while (Clock::now() < until) {
      failures += agent.metrics().find("tessera_config_generation") == std::string::npos;
      failures += agent.config_generation() == 0;
      ++scrapes;
    }
  });
  for (std::thread& thread : threads) thread.join();
  agent.stop();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(reloads.load(), 10);
  EXPECT_GT(events.load(), 10);
  EXPECT_GT(allocations.load(), 100);
  EXPECT_GT(lists.load(), 100);
  EXPECT_GT(scrapes.load(), 10);
  EXPECT_GT(agent.config_generation(), 5u);  // most edits changed the replicas
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

// A GPU NVML cannot watch for errors is unhealthy, as NVIDIA's plugin holds, and stays so:
// quiet is no news when nobody listens.
TEST(NodeAgentThreads, AGpuThatCannotBeWatchedStaysUnhealthyPastTheRecoveryPeriod) {
  ScratchDirectory scratch;
  setenv("TESSERA_SIM_DEVICES", "H100,context=0", 1);
  setenv("TESSERA_SIM_STATE", scratch.file("sim").c_str(), 1);
  setenv("TESSERA_SIM_FAIL", "nvmlDeviceRegisterEvents", 1);
  node::NodeAgentOptions options;
  options.node_name = "unwatched";
  options.nvml_library = build_path("sim/libnvidia-ml.so.1");
  options.device_plugin_dir = scratch.file("dp");
  options.state_dir = scratch.file("state");
  options.recovery_quiet = 20ms;
  node::NodeAgent agent(std::move(options));
  agent.start();  // the variable stays set while the agent's threads may read it
  auto healthy = [&] { return agent.devices_of("nvidia.com/gpu").at(0).healthy; };
  const auto began = Clock::now();
  while (healthy() && Clock::now() - began < 10s) std::this_thread::yield();
  EXPECT_FALSE(healthy()) << "an unwatched GPU was served as healthy";
  // Ten recovery periods later it is still down.
  const auto marked = Clock::now();
  while (Clock::now() - marked < 200ms) {
    ASSERT_FALSE(healthy()) << "recovered after " << (Clock::now() - marked).count() << " ns";
  }
  EXPECT_NE(agent.metrics().find("tessera_gpu_healthy{gpu=\"0\""), std::string::npos);
  agent.stop();
  unsetenv("TESSERA_SIM_FAIL");
}

}  // namespace
}  // namespace tessera::test
