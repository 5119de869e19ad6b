// The priority matrix on a real GPU, for the GPU check (run under the hook by run.sh).
//   serve COUNT [LOAD]: COUNT spin kernels of 1 ms (one block per SM), each awaited, then
//     idle 1 ms (50 % duty) or, with LOAD (percent), an exponential idle time for that mean
//     load (Poisson arrivals; seed 42). Prints the 99th percentile of the latency from the
//     launch call to the end the host sees: p99_us.
//   batch MICROSECONDS SECONDS [graph]: saturates the GPU with spin kernels of that length
//     (4 to a graph with `graph`), 8 to 16 queued, prints "started" once running, and at the
//     end the share of the time its work ran (from its own event-timed length): achieved.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "spin.cuh"

namespace {

struct Spinner {
  int sms = 0;
  long long cycles_per_us = 0;
  cudaStream_t stream = nullptr;
  Spinner() {
    int clock_khz = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
    check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "clock rate");
    cycles_per_us = clock_khz / 1000;
    check(cudaStreamCreate(&stream), "stream");
  }
  void launch(long long microseconds) {
    spin<<<sms, 32, 0, stream>>>(cycles_per_us * microseconds);
    check(cudaGetLastError(), "launch");
  }
};

int serve(int count, int load) {
  Spinner gpu;
  std::mt19937_64 draws(42);
  const double mean_idle_us = load > 0 ? 1000.0 * (100 - load) / load : 1000.0;
  std::exponential_distribution<double> idle_draw(1.0 / mean_idle_us);
  std::vector<double> latencies;
  for (int i = 0; i < count + 10; ++i) {  // the first 10 warm the GPU and the hook's prices
    const double start = now_seconds();
    gpu.launch(1000);
    check(cudaStreamSynchronize(gpu.stream), "sync");
    if (i >= 10) latencies.push_back((now_seconds() - start) * 1e6);
    const double idle_us = load > 0 ? idle_draw(draws) : mean_idle_us;
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long long>(idle_us)));
  }
  std::sort(latencies.begin(), latencies.end());
  std::printf("p99_us=%.0f\n", latencies[latencies.size() * 99 / 100]);
  return 0;
}

int batch(long long microseconds, double seconds, bool graph_mode) {
  Spinner gpu;
  cudaGraphExec_t graph = nullptr;
  if (graph_mode) {
    cudaGraph_t captured = nullptr;
    check(cudaStreamBeginCapture(gpu.stream, cudaStreamCaptureModeGlobal), "capture");
    for (int i = 0; i < 4; ++i) gpu.launch(microseconds);
    check(cudaStreamEndCapture(gpu.stream, &captured), "end capture");
    check(cudaGraphInstantiate(&graph, captured, 0), "instantiate");
  }
  auto launch = [&] {
    if (graph_mode) {
      check(cudaGraphLaunch(graph, gpu.stream), "graph launch");
    } else {
      gpu.launch(microseconds);
    }
  };
  const float unit_ms = least_event_ms(gpu.stream, 10, launch);  // the unit's device time
  cudaEvent_t batches[2];
  check(cudaEventCreateWithFlags(&batches[0], cudaEventDisableTiming), "event");
  check(cudaEventCreateWithFlags(&batches[1], cudaEventDisableTiming), "event");
  const double begin = now_seconds();
  long launches = 0;
  while (now_seconds() < begin + seconds) {
    launch();
    if (++launches == 1) {
      std::printf("started\n");
      std::fflush(stdout);
    }
    if (launches % 8 == 0) {
      cudaEvent_t& slot = batches[(launches / 8) % 2];
      if (launches >= 16) check(cudaEventSynchronize(slot), "batch sync");
      check(cudaEventRecord(slot, gpu.stream), "batch record");
    }
  }
  check(cudaStreamSynchronize(gpu.stream), "final sync");
  const double window = now_seconds() - begin;
  std::printf("unit_us=%.1f\nachieved=%.1f\n", unit_ms * 1000.0,
              100.0 * launches * unit_ms / 1000.0 / window);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc >= 3 && std::strcmp(argv[1], "serve") == 0) {
    return serve(std::atoi(argv[2]), argc > 3 ? std::atoi(argv[3]) : 0);
  }
  if (argc >= 4 && std::strcmp(argv[1], "batch") == 0) {
    return batch(std::atoll(argv[2]), std::atof(argv[3]),
                 argc > 4 && std::strcmp(argv[4], "graph") == 0);
  }
  std::fprintf(stderr, "usage: %s serve COUNT [LOAD] | batch MICROSECONDS SECONDS [graph]\n",
               argv[0]);
  return 2;
}
