// A saturating kernel loop, as the GPU check runs it under a compute share: launches a
// kernel that spins for about 200 us on every SM, keeping 8 to 16 launches queued, for
// SECONDS; prints the kernel's own duration (the least of many CUDA-event timings) and the
// share of the GPU's time the loop achieved after a half-second warm-up.
// Usage: compute_share SECONDS [plain|graph]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "spin.cuh"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SECONDS [plain|graph]\n", argv[0]);
    return 2;
  }
  const double seconds = std::atof(argv[1]);
  const bool graph_mode = argc > 2 && std::strcmp(argv[2], "graph") == 0;
  int sms = 0, clock_khz = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "clock rate");
  const long long cycles = static_cast<long long>(clock_khz) * 200 / 1000;  // ~200 us
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "stream");

  // One unit of work: a kernel, or a graph of four.
  cudaGraphExec_t graph = nullptr;
  if (graph_mode) {
    cudaGraph_t captured = nullptr;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture");
    for (int i = 0; i < 4; ++i) spin<<<sms, 32, 0, stream>>>(cycles);
    check(cudaStreamEndCapture(stream, &captured), "end capture");
    check(cudaGraphInstantiate(&graph, captured, 0), "instantiate");
  }
  auto launch = [&] {
    if (graph_mode) {
      check(cudaGraphLaunch(graph, stream), "graph launch");
    } else {
      spin<<<sms, 32, 0, stream>>>(cycles);
      check(cudaGetLastError(), "launch");
    }
  };

  // The unit's device time: the least of 20 event-timed runs (others' work can only add).
  const float unit_ms = least_event_ms(stream, 20, launch);

  cudaEvent_t batches[2];
  check(cudaEventCreateWithFlags(&batches[0], cudaEventDisableTiming), "event");
  check(cudaEventCreateWithFlags(&batches[1], cudaEventDisableTiming), "event");
  const double begin = now_seconds();
  double window_start = 0;
  long launches = 0, counted = 0;
  while (now_seconds() < begin + seconds) {
    launch();
    ++launches;
    if (window_start == 0 && now_seconds() >= begin + 0.5) window_start = now_seconds();
    if (window_start != 0) ++counted;
    if (launches % 8 == 0) {  // wait for the batch before last: 8 to 16 queued
      cudaEvent_t& slot = batches[(launches / 8) % 2];
      if (launches >= 16) check(cudaEventSynchronize(slot), "batch sync");
      check(cudaEventRecord(slot, stream), "batch record");
    }
  }
  check(cudaStreamSynchronize(stream), "final sync");
  const double window = now_seconds() - window_start;
  std::printf("unit_us=%.1f\nlaunches=%ld\nwindow_s=%.3f\nachieved=%.1f\n", unit_ms * 1000.0,
              launches, window, 100.0 * counted * unit_ms / 1000.0 / window);
  return 0;
}
