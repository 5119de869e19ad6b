// What the GPU check's CUDA programs share: a kernel that spins for a number of clock
// cycles, an error check that prints `error=NAME (what)` and exits, a host clock, and the
// device time of one unit of work.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::printf("error=%s (%s)\n", cudaGetErrorName(status), what);
  std::exit(1);
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The device time of `launch()`'s work on `stream`, in ms: the least of `runs` event-timed
// runs (others' work can only add to one).
template <typename Launch>
float least_event_ms(cudaStream_t stream, int runs, Launch launch) {
  cudaEvent_t before = nullptr, after = nullptr;
  check(cudaEventCreate(&before), "event");
  check(cudaEventCreate(&after), "event");
  float least = 1e9f;
  for (int i = 0; i < runs; ++i) {
    check(cudaEventRecord(before, stream), "record");
    launch();
    check(cudaEventRecord(after, stream), "record");
    check(cudaEventSynchronize(after), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, before, after), "elapsed");
    least = ms < least ? ms : least;
  }
  check(cudaEventDestroy(before), "event");
  check(cudaEventDestroy(after), "event");
  return least;
}
