// What the hook adds to the calls it interposes, against calling the simulated driver
// directly in the same process and run:
//   - a cuMemAlloc/cuMemFree pair with a memory limit in force (target: < 200 ns added);
//   - a cuLaunchKernel with no compute limit (target: < 10 ns added);
//   - under a compute share, a launch the driver rejects (target: no dearer than an accepted
//     one, and no slower launches after it);
//   - alloc/free throughput of 1 and 8 processes in one group (target: 8 within 2x of 1).
// bench/run.sh runs it with repetitions and reports medians and ratios.
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "contract/variables.h"
#include "cuda_abi/cuda_abi.h"

namespace {

using namespace tessera::abi;

struct Driver {
  PFN_cuInit init;
  PFN_cuDevicePrimaryCtxRetain retain;
  PFN_cuCtxSetCurrent set_current;
  PFN_cuMemAlloc_v2 alloc;
  PFN_cuMemFree_v2 free;
  PFN_cuModuleLoadData load;
  PFN_cuModuleGetFunction function;
  PFN_cuLaunchKernel launch;
};

// From `library`, or from the driver for what the hook does not interpose.
template <typename T>
T symbol(void* library, const char* name) {
  auto* found = reinterpret_cast<T>(dlsym(library, name));
  if (found == nullptr) found = reinterpret_cast<T>(dlsym(dlopen("libcuda.so.1", RTLD_NOW), name));
  if (found == nullptr) {
    std::fprintf(stderr, "missing %s\n", name);
    std::exit(1);
  }
  return found;
}

Driver load(const char* path) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
    std::exit(1);
  }
  return Driver{symbol<PFN_cuInit>(library, "cuInit"),
                symbol<PFN_cuDevicePrimaryCtxRetain>(library, "cuDevicePrimaryCtxRetain"),
                symbol<PFN_cuCtxSetCurrent>(library, "cuCtxSetCurrent"),
                symbol<PFN_cuMemAlloc_v2>(library, "cuMemAlloc_v2"),
                symbol<PFN_cuMemFree_v2>(library, "cuMemFree_v2"),
                symbol<PFN_cuModuleLoadData>(library, "cuModuleLoadData"),
                symbol<PFN_cuModuleGetFunction>(library, "cuModuleGetFunction"),
                symbol<PFN_cuLaunchKernel>(library, "cuLaunchKernel")};
}

// The simulated driver itself, and the hook in front of it (which loads the same driver).
Driver& direct() {
  static Driver driver = load("libcuda.so.1");
  return driver;
}
Driver& hooked() {
  static Driver driver = load(TESSERA_HOOK_LIBRARY);
  return driver;
}
Driver& pick(int which) {
  return which == 0 ? direct() : hooked();
}

void start(Driver& driver) {
  CUcontext context = nullptr;
  if (driver.init(0) != CUDA_SUCCESS || driver.retain(&context, 0) != CUDA_SUCCESS ||
      driver.set_current(context) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cannot start CUDA\n");
    std::exit(1);
  }
}

void AllocFree(benchmark::State& state) {
  Driver& driver = pick(static_cast<int>(state.range(0)));
  start(driver);
  for (auto _ : state) {
    CUdeviceptr pointer = 0;
    if (driver.alloc(&pointer, 4096) != CUDA_SUCCESS) state.SkipWithError("alloc failed");
    driver.free(pointer);
  }
  state.SetLabel(state.range(0) == 0 ? "direct" : "hooked");
}
BENCHMARK(AllocFree)->Arg(0)->Arg(1);

void LaunchKernel(benchmark::State& state) {
  Driver& driver = pick(static_cast<int>(state.range(0)));
  start(driver);
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  driver.load(&module, "kernels");
  driver.function(&function, module, "spin");
  // A zero-block grid, which the driver rejects at once: the hook forwards it exactly as it
  // forwards any launch, and the simulated driver's timeline (about a microsecond a kernel)
  // does not drown the few nanoseconds being measured.
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        driver.launch(function, 0, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr));
  }
  state.SetLabel(state.range(0) == 0 ? "direct" : "hooked");
}
BENCHMARK(LaunchKernel)->Arg(0)->Arg(1);

// Real launches of a 1 us kernel, in batches, each after `rejected` launches of the zero-block
// grid: with TESSERA_CORE_LIMIT set (bench/run.sh runs these a second time with a 100 %
// share) every hooked launch is paced and measured.
void timed_launches(benchmark::State& state, int rejected) {
  Driver& driver = pick(static_cast<int>(state.range(0)));
  start(driver);
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  driver.load(&module, "kernels");
  driver.function(&function, module, "tiny@1us");
  auto synchronize = reinterpret_cast<PFN_cuCtxSynchronize>(
      dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuCtxSynchronize"));
  long launches = 0;
  for (auto _ : state) {
    for (int i = 0; i < rejected; ++i) {
      benchmark::DoNotOptimize(
          driver.launch(function, 0, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr));
    }
    benchmark::DoNotOptimize(
        driver.launch(function, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr));
    if (++launches % 64 == 0) synchronize();  // keep the queue short
  }
  state.SetLabel(state.range(0) == 0 ? "direct" : "hooked");
}

void LaunchKernelTimed(benchmark::State& state) {
  timed_launches(state, 0);
}
BENCHMARK(LaunchKernelTimed)->Arg(0)->Arg(1);

// A rejected launch before each real one: under a compute share the pair should cost what
// the two launches cost apart, so a rejected launch neither costs more than an accepted one
// nor slows the launches after it.
void LaunchKernelAfterRejected(benchmark::State& state) {
  timed_launches(state, 1);
}
BENCHMARK(LaunchKernelAfterRejected)->Arg(0)->Arg(1);

// N processes in one group, each doing `kPairs` alloc/free pairs; items/s is the total.
void ContendedAllocFree(benchmark::State& state) {
  constexpr int kPairs = 20000;
  const int processes = static_cast<int>(state.range(0));
  const int which = static_cast<int>(state.range(1));
  for (auto _ : state) {
    const auto begin = std::chrono::steady_clock::now();
    std::vector<pid_t> children;
    for (int i = 0; i < processes; ++i) {
      const pid_t child = fork();
      if (child == 0) {
        Driver& driver = pick(which);
        start(driver);
        for (int pair = 0; pair < kPairs; ++pair) {
          CUdeviceptr pointer = 0;
          if (driver.alloc(&pointer, 4096) != CUDA_SUCCESS) _exit(1);
          driver.free(pointer);
        }
        _exit(0);
      }
      children.push_back(child);
    }
    for (pid_t child : children) {
      int status = 0;
      waitpid(child, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) state.SkipWithError("a child failed");
    }
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
  }
  state.SetItemsProcessed(state.iterations() * processes * kPairs);
  state.SetLabel(which == 0 ? "direct" : "hooked");
}
BENCHMARK(ContendedAllocFree)
    ->ArgsProduct({{1, 8}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  // A memory limit is in force for the hooked runs (each process its own private group, or
  // the group named by TESSERA_LEDGER, as bench/run.sh sets up for the contended case).
  setenv(tessera::contract::kMemoryLimitVariable, "64GiB", 0);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
