// bench_node: how fast tessera node answers the kubelet, measured through the test kubelet
// over real gRPC against the real binary on the simulated GPU.
//
// - Allocate latency (whole GPUs, time-slicing replicas, and slices with their ledger), beside
//   a baseline in the same run: GetDevicePluginOptions, the cheapest call the plugin answers,
//   which is the gRPC round trip itself. Medians and p99 of every call, and their ratios.
// - Health propagation: from an XID raised on the simulated GPU (tesseraSimRaiseEvent, what
//   `tessera simgpu event` calls) to the kubelet holding a list with every replica of that GPU
//   unhealthy; beside it the raise alone.
//
//   bench_node [BUILD_DIR] [CALLS] [EVENTS]
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "latency.h"
#include "test_kubelet.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using tessera::test::TestKubelet;

using tessera::bench::micros;
using tessera::bench::percentile;

// Starts argv with its output discarded (the agent logs every slice it grants).
pid_t spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& word : argv) args.push_back(const_cast<char*>(word.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t quiet;
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&quiet, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int failed = posix_spawn(&pid, args[0], &quiet, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&quiet);
  if (failed != 0) {
    std::fprintf(stderr, "cannot start %s\n", argv[0].c_str());
    std::exit(1);
  }
  return pid;
}

int wait_for(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string uuid(int index) {
  char text[48];
  std::snprintf(text, sizeof text, "GPU-7e55e7a0-0000-4000-8000-%012x", index);
  return text;
}

struct Row {
  std::string name;
  std::vector<double> us;
};

void print(const Row& row, double baseline_median) {
  const double median = percentile(row.us, 0.5), p99 = percentile(row.us, 0.99);
  std::printf("%-34s %6zu calls  p50 %8.1f us  p99 %8.1f us  p50 / baseline %5.2fx\n",
              row.name.c_str(), row.us.size(), median, p99,
              baseline_median > 0 ? median / baseline_median : 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string build = argc > 1 ? argv[1] : "build";
  const int calls = argc > 2 ? std::atoi(argv[2]) : 2000;
  const int events = argc > 3 ? std::atoi(argv[3]) : 20;
  char pattern[] = "/tmp/tessera-bench-node-XXXXXX";
  const std::string scratch = mkdtemp(pattern);
  setenv("LD_LIBRARY_PATH", (build + "/sim").c_str(), 1);
  setenv("TESSERA_SIM_STATE", (scratch + "/sim").c_str(), 1);
  setenv("TESSERA_SIM_DEVICES", "H100,context=0;H100,context=0", 1);
  std::ofstream(scratch + "/slices.yaml")
      << "version: v1\nsharing:\n  slices:\n    resources:\n    - name: nvidia.com/gpu\n      "
         "replicas: 4\n"
         "      memoryPerSlice: 8GiB\n      coresPerSlice: 25\n";
  std::ofstream(scratch + "/replicas.yaml")
      << "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      "
         "replicas: 4\n";

  std::printf("tessera node through the test kubelet (gRPC on a unix socket), %d calls each\n",
              calls);
  Row baseline{"GetDevicePluginOptions (baseline)", {}};
  std::vector<Row> rows;
  for (const char* mode : {"whole", "replicas", "slices"}) {
    const std::string dp = scratch + "/dp-" + mode;
    TestKubelet kubelet(dp);
    std::vector<std::string> node = {
        build + "/bin/tessera", "node", "--node-name", "bench",
        "--device-plugin-dir",  dp,     "--state-dir", scratch + "/state-" + mode,
        "--recovery-period",    "1"};
    if (std::string(mode) != "whole") {
      node.push_back("--config-file");
      node.push_back(scratch + "/" + mode + ".yaml");
    }
    const pid_t agent = spawn(node);
    if (!kubelet.wait_for_devices(
            "nvidia.com/gpu", [](const auto& list) { return !list.empty(); },
            std::chrono::seconds(20))) {
      std::fprintf(stderr, "tessera node did not register\n");
      kill(agent, SIGTERM);
      return 1;
    }
    const std::string id = std::string(mode) == "whole" ? uuid(0) : uuid(0) + "::1";
    Row row{std::string("Allocate, ") + mode, {}};
    for (int i = 0; i < calls; ++i) {
      v1beta1::DevicePluginOptions options;
      auto start = Clock::now();
      if (!kubelet.options("nvidia.com/gpu", options).ok()) return 1;
      baseline.us.push_back(micros(Clock::now() - start));
      v1beta1::AllocateResponse response;
      start = Clock::now();
      const grpc::Status status = kubelet.allocate("nvidia.com/gpu", {{id}}, response);
      row.us.push_back(micros(Clock::now() - start));
      if (!status.ok()) {
        std::fprintf(stderr, "Allocate failed: %s\n", status.error_message().c_str());
        return 1;
      }
    }
    rows.push_back(row);

    if (std::string(mode) == "replicas") {  // health propagation, on the replicas' node
      Row raise{"raising the XID (baseline)", {}}, propagate{"XID to every replica unhealthy", {}};
      void* nvml = dlopen((build + "/sim/libnvidia-ml.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
      auto init =
          reinterpret_cast<int (*)()>(nvml == nullptr ? nullptr : dlsym(nvml, "nvmlInit_v2"));
      auto raise_event =
          reinterpret_cast<int (*)(unsigned, unsigned long long, unsigned long long)>(
              nvml == nullptr ? nullptr : dlsym(nvml, "tesseraSimRaiseEvent"));
      if (init == nullptr || raise_event == nullptr || init() != 0) {
        std::fprintf(stderr, "cannot load the simulated NVML\n");
        return 1;
      }
      for (int i = 0; i < events; ++i) {
        const int gpu = i % 2;
        auto all = [&](const char* health) {
          return [gpu, health](const TestKubelet::Devices& list) {
            int matching = 0;
            for (const auto& [device, state] : list)
              matching += device.rfind(uuid(gpu), 0) == 0 && state.health == health;
            return matching == 4;
          };
        };
        // Healthy again first (recovery after 1 s), then the next XID.
        if (!kubelet.wait_for_devices("nvidia.com/gpu", all("Healthy"), std::chrono::seconds(30)))
          return 1;
        const auto start = Clock::now();
        if (raise_event(static_cast<unsigned>(gpu), 0x8 /* XID critical error */, 79) != 0)
          return 1;
        raise.us.push_back(micros(Clock::now() - start));
        if (!kubelet.wait_for_devices("nvidia.com/gpu", all("Unhealthy"), std::chrono::seconds(5)))
          return 1;
        // When the list arrived, as the test kubelet stamped it.
        propagate.us.push_back(micros(kubelet.updates("nvidia.com/gpu").back().at - start));
      }
      rows.push_back(raise);
      rows.push_back(propagate);
    }
    kill(agent, SIGTERM);
    wait_for(agent);
  }
  const double base = percentile(baseline.us, 0.5);
  print(baseline, base);
  double raise_median = 0;
  for (const Row& row : rows) {
    if (row.name.rfind("raising", 0) == 0) raise_median = percentile(row.us, 0.5);
    print(row, row.name.rfind("Allocate", 0) == 0 ? base : raise_median);
  }
  fs::remove_all(scratch);
  return 0;
}
