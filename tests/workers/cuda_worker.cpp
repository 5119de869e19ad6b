// A driver-API program that the tests run under the hook: one subcommand per behaviour,
// results printed as key=value lines. It links libcuda.so.1 by name, like any CUDA program,
// so the same binary runs on the simulated GPU and on a real one.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "cuda_abi/cuda_abi.h"
#include "cuda_abi/nvml_abi.h"
#include "host_record.h"

using namespace tessera::abi;
using tessera::monotonic_ns;

#define TESSERA_DECLARE_DRIVER(name, params) extern "C" CUresult name params;
TESSERA_CUDA_HOOKED(TESSERA_DECLARE_DRIVER)
TESSERA_CUDA_PASSTHROUGH(TESSERA_DECLARE_DRIVER)
#undef TESSERA_DECLARE_DRIVER
#define TESSERA_DECLARE_NVML(name, params) extern "C" nvmlReturn_t name params;
TESSERA_NVML_HOOKED(TESSERA_DECLARE_NVML)
TESSERA_NVML_PASSTHROUGH(TESSERA_DECLARE_NVML)
#undef TESSERA_DECLARE_NVML
// Older names tools still call; the hook leaves them to the driver.
extern "C" nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device);
extern "C" nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                             unsigned int* count,
                                                             nvmlProcessInfo_v1_t* infos);
extern "C" nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                        nvmlProcessUtilizationSample_t* samples,
                                                        unsigned int* count,
                                                        unsigned long long last_seen_us);

namespace {

constexpr std::size_t kMiB = 1ull << 20;

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    std::printf("error=%d during=%s\n", result, what);
    std::fflush(stdout);
    std::exit(3);
  }
}

CUcontext start(int device = 0) {
  check(cuInit(0), "cuInit");
  CUcontext context = nullptr;
  check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  return context;
}

// What the driver itself records this process as holding on device 0 (NVML's process list,
// which the hook leaves alone).
unsigned long long driver_process_usage() {
  if (nvmlInit_v2() != NVML_SUCCESS) return 0;
  nvmlDevice_t device = nullptr;
  if (nvmlDeviceGetHandleByIndex_v2(0, &device) != NVML_SUCCESS) return 0;
  nvmlProcessInfo_t infos[64];
  unsigned count = 64;
  if (nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos) != NVML_SUCCESS) return 0;
  for (unsigned i = 0; i < count; ++i) {
    if (infos[i].pid == static_cast<unsigned>(getpid())) return infos[i].usedGpuMemory;
  }
  return 0;
}

void print_view(const char* prefix) {
  std::size_t free = 0, total = 0;
  check(cuMemGetInfo_v2(&free, &total), "cuMemGetInfo");
  std::printf("%sfree=%zu\n%stotal=%zu\n%sdriver_used=%llu\n", prefix, free, prefix, total, prefix,
              driver_process_usage());
}

// Allocates `bytes` through one named path; prints result=<CUresult>. Leaves it allocated
// when `keep`, else frees it and checks the free succeeded.
// A pool of device memory on device 0, of its own (not the device's default pool).
CUmemoryPool new_device_pool() {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = nullptr;
  check(cuMemPoolCreate(&pool, &props), "cuMemPoolCreate");
  return pool;
}

int allocate_via(const std::string& path, std::size_t bytes, bool keep) {
  CUresult result = CUDA_ERROR_INVALID_VALUE;
  if (path == "alloc") {
    CUdeviceptr p = 0;
    result = cuMemAlloc_v2(&p, bytes);
    if (result == CUDA_SUCCESS && !keep) check(cuMemFree_v2(p), "cuMemFree");
  } else if (path == "pitch") {
    CUdeviceptr p = 0;
    std::size_t pitch = 0;
    // 1000-byte rows: the driver pads each to its pitch, which is what must be charged.
    result = cuMemAllocPitch_v2(&p, &pitch, 1000, bytes / 1000, 4);
    if (result == CUDA_SUCCESS) std::printf("pitch=%zu\n", pitch);
    if (result == CUDA_SUCCESS && !keep) check(cuMemFree_v2(p), "cuMemFree");
  } else if (path == "managed") {
    CUdeviceptr p = 0;
    result = cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
    if (result == CUDA_SUCCESS && !keep) check(cuMemFree_v2(p), "cuMemFree");
  } else if (path == "async") {
    CUdeviceptr p = 0;
    result = cuMemAllocAsync(&p, bytes, nullptr);
    if (result == CUDA_SUCCESS && !keep) {
      check(cuMemFreeAsync(p, nullptr), "cuMemFreeAsync");
      check(cuStreamSynchronize(nullptr), "cuStreamSynchronize");
    }
  } else if (path == "pool") {
    CUmemoryPool pool = new_device_pool();
    CUdeviceptr p = 0;
    result = cuMemAllocFromPoolAsync(&p, bytes, pool, nullptr);
    if (result == CUDA_SUCCESS && !keep) {
      check(cuMemFreeAsync(p, nullptr), "cuMemFreeAsync");
      check(cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo");
      check(cuMemPoolDestroy(pool), "cuMemPoolDestroy");
    }
  } else if (path == "vmm" || path == "vmm-host") {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = path == "vmm" ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
    prop.location.id = 0;
    std::size_t granularity = 0;
    check(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "granularity");
    const std::size_t size = (bytes + granularity - 1) / granularity * granularity;
    CUmemGenericAllocationHandle handle = 0;
    result = cuMemCreate(&handle, size, &prop, 0);
    if (result == CUDA_SUCCESS) {
      // Map, release the handle while mapped (as the CUDA samples do), then unmap: the
      // memory lives until the unmap.
      CUdeviceptr va = 0;
      check(cuMemAddressReserve(&va, size, 0, 0, 0), "cuMemAddressReserve");
      check(cuMemMap(va, size, 0, handle, 0), "cuMemMap");
      check(cuMemRelease(handle), "cuMemRelease");
      print_view("mapped_");
      if (!keep) {
        check(cuMemUnmap(va, size), "cuMemUnmap");
        check(cuMemAddressFree(va, size), "cuMemAddressFree");
      }
    }
  } else if (path == "array" || path == "array3d" || path == "mipmap") {
    // 4-byte texels, 1000 wide: rows are padded by the driver.
    const std::size_t height = bytes / 4000;
    if (path == "array") {
      CUDA_ARRAY_DESCRIPTOR desc{1000, height, CU_AD_FORMAT_FLOAT, 1};
      CUarray array = nullptr;
      result = cuArrayCreate_v2(&array, &desc);
      if (result == CUDA_SUCCESS && !keep) check(cuArrayDestroy(array), "cuArrayDestroy");
    } else if (path == "array3d") {
      CUDA_ARRAY3D_DESCRIPTOR desc{1000, height / 4, 4, CU_AD_FORMAT_FLOAT, 1, 0};
      CUarray array = nullptr;
      result = cuArray3DCreate_v2(&array, &desc);
      if (result == CUDA_SUCCESS && !keep) check(cuArrayDestroy(array), "cuArrayDestroy");
    } else {
      CUDA_ARRAY3D_DESCRIPTOR desc{1000, height, 0, CU_AD_FORMAT_FLOAT, 1, 0};
      CUmipmappedArray array = nullptr;
      result = cuMipmappedArrayCreate(&array, &desc, 3);
      if (result == CUDA_SUCCESS && !keep) check(cuMipmappedArrayDestroy(array), "destroy");
    }
  } else if (path == "context") {
    CUcontext context = nullptr;
    result = cuCtxCreate_v4(&context, nullptr, 0, 0);
    if (result == CUDA_SUCCESS && !keep) check(cuCtxDestroy_v2(context), "cuCtxDestroy");
  } else {
    std::printf("unknown path %s\n", path.c_str());
    return 2;
  }
  std::printf("result=%d\n", result);
  return 0;
}

using AllocFunction = CUresult (*)(CUdeviceptr*, std::size_t);
using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                               CUdriverProcAddressQueryResult*);

// Finds cuMemAlloc through one of the ways programs reach the driver.
AllocFunction find_alloc(const std::string& mode) {
  if (mode == "direct") return &cuMemAlloc_v2;
  if (mode == "dlsym") {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return reinterpret_cast<AllocFunction>(dlsym(handle, "cuMemAlloc_v2"));
  }
  GetProcV2 get_proc = &cuGetProcAddress_v2;
  if (mode == "procaddress-self") {
    // cudart asks the driver for cuGetProcAddress itself, then uses that for everything.
    void* self = nullptr;
    check(cuGetProcAddress_v2("cuGetProcAddress", &self, 12000, 0, nullptr), "lookup self");
    get_proc = reinterpret_cast<GetProcV2>(self);
  }
  void* found = nullptr;
  CUdriverProcAddressQueryResult status = -1;
  // "procaddress-3020": what a CUDA 3.2-era runtime would ask for.
  const int version = mode == "procaddress-3020" ? 3020 : 12000;
  check(get_proc("cuMemAlloc", &found, version, CU_GET_PROC_ADDRESS_DEFAULT, &status), "lookup");
  if (status != CU_GET_PROC_ADDRESS_SUCCESS) std::printf("lookup_status=%d\n", status);
  return reinterpret_cast<AllocFunction>(found);
}

// cuMemAllocAsync looked up for per-thread default streams must still be governed.
int lookup_per_thread(std::size_t bytes) {
  start();
  void* found = nullptr;
  CUdriverProcAddressQueryResult status = -1;
  check(cuGetProcAddress_v2("cuMemAllocAsync", &found, 12000,
                            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status),
        "lookup");
  using AsyncFunction = CUresult (*)(CUdeviceptr*, std::size_t, CUstream);
  CUdeviceptr p = 0;
  std::printf("result=%d\n", reinterpret_cast<AsyncFunction>(found)(&p, bytes, nullptr));
  // Statuses for a symbol that does not exist and one asked for too early.
  check(cuGetProcAddress_v2("cuNoSuchFunction", &found, 12000, 0, &status), "lookup missing");
  std::printf("missing_status=%d\nmissing_pointer=%s\n", status, found ? "set" : "null");
  check(cuGetProcAddress_v2("cuMemAllocAsync", &found, 11000, 0, &status), "lookup early");
  std::printf("early_status=%d\nearly_pointer=%s\n", status, found ? "set" : "null");
  return 0;
}

int lookup(const std::string& mode, std::size_t bytes) {
  if (mode == "procaddress-ptsz") return lookup_per_thread(bytes);
  start();
  AllocFunction allocate = find_alloc(mode);
  if (allocate == nullptr) {
    std::printf("result=not-found\n");
    return 0;
  }
  CUdeviceptr p = 0;
  const CUresult result = allocate(&p, bytes);
  std::printf("result=%d\n", result);
  if (result == CUDA_SUCCESS) check(cuMemFree_v2(p), "cuMemFree");
  return 0;
}

// Threads allocating and freeing random sizes; prints how many allocations were refused.
int stress(int threads, int iterations, std::size_t max_bytes, unsigned seed) {
  CUcontext context = start();
  std::printf("ready\n");  // then wait for the word to start, so all contend at once
  char go[8];
  if (read(STDIN_FILENO, go, sizeof go) <= 0) return 5;
  std::atomic<long> refused{0}, granted{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
      std::mt19937_64 random(seed * 1000 + static_cast<unsigned>(t));
      std::vector<CUdeviceptr> held;
      for (int i = 0; i < iterations; ++i) {
        if (!held.empty() && (random() % 3 == 0 || held.size() > 8)) {
          const std::size_t index = random() % held.size();
          check(cuMemFree_v2(held[index]), "cuMemFree");
          held.erase(held.begin() + static_cast<long>(index));
          continue;
        }
        CUdeviceptr p = 0;
        const CUresult result = cuMemAlloc_v2(&p, 1 + random() % max_bytes);
        if (result == CUDA_SUCCESS) {
          held.push_back(p);
          ++granted;
        } else if (result == CUDA_ERROR_OUT_OF_MEMORY) {
          ++refused;
        } else {
          check(result, "cuMemAlloc");
        }
      }
      for (CUdeviceptr p : held) check(cuMemFree_v2(p), "cuMemFree");
    });
  }
  for (auto& worker : workers) worker.join();
  std::printf("granted=%ld\nrefused=%ld\n", granted.load(), refused.load());
  return 0;
}

// Allocates and frees through several paths forever: a target for kill -9.
int churn(unsigned seed) {
  start();
  std::mt19937_64 random(seed);
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) {
    const std::size_t bytes = (1 + random() % 64) * kMiB;
    CUdeviceptr p = 0;
    switch (random() % 3) {
      case 0:
        if (cuMemAlloc_v2(&p, bytes) == CUDA_SUCCESS) cuMemFree_v2(p);
        break;
      case 1:
        if (cuMemAllocAsync(&p, bytes, nullptr) == CUDA_SUCCESS) {
          cuMemFreeAsync(p, nullptr);
          cuStreamSynchronize(nullptr);
        }
        break;
      default:
        if (cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS) cuMemFree_v2(p);
        break;
    }
  }
}

// A pool keeps freed memory until a synchronisation point releases what is above its
// release threshold: the group must be charged for what the pool holds.
int pool_cache(std::size_t bytes) {
  start();
  CUmemoryPool pool = nullptr;
  check(cuDeviceGetMemPool(&pool, 0), "cuDeviceGetMemPool");
  CUdeviceptr p = 0;
  check(cuMemAllocAsync(&p, bytes, nullptr), "cuMemAllocAsync");
  check(cuMemFreeAsync(p, nullptr), "cuMemFreeAsync");
  print_view("cached_");  // freed but still held by the pool
  check(cuStreamSynchronize(nullptr), "cuStreamSynchronize");
  print_view("synced_");  // released: threshold 0
  std::uint64_t threshold = ~0ull;
  check(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), "threshold");
  check(cuMemAllocAsync(&p, bytes, nullptr), "cuMemAllocAsync");
  check(cuMemFreeAsync(p, nullptr), "cuMemFreeAsync");
  check(cuStreamSynchronize(nullptr), "cuStreamSynchronize");
  print_view("kept_");  // the threshold keeps it in the pool
  CUdeviceptr q = 0;
  std::printf("reuse_result=%d\n", cuMemAllocAsync(&q, bytes, nullptr));  // served from the pool
  check(cuMemFreeAsync(q, nullptr), "cuMemFreeAsync");
  check(cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo");
  print_view("trimmed_");
  return 0;
}

// COUNT pools of their own, BYTES allocated from each and freed; then a sync point, at which
// every pool gives back what it holds beyond its release threshold (0).
int many_pools(int count, std::size_t bytes) {
  start();
  for (int i = 0; i < count; ++i) {
    CUmemoryPool pool = new_device_pool();
    CUdeviceptr p = 0;
    check(cuMemAllocFromPoolAsync(&p, bytes, pool, nullptr), "cuMemAllocFromPoolAsync");
    check(cuMemFreeAsync(p, nullptr), "cuMemFreeAsync");
  }
  print_view("cached_");
  check(cuStreamSynchronize(nullptr), "cuStreamSynchronize");
  print_view("synced_");
  return 0;
}

int nvml_view() {
  start();
  check(nvmlInit_v2() == NVML_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, "nvmlInit");
  nvmlDevice_t device = nullptr;
  check(
      nvmlDeviceGetHandleByIndex_v2(0, &device) == NVML_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN,
      "nvmlDeviceGetHandleByIndex");
  nvmlMemory_t memory{};
  check(
      nvmlDeviceGetMemoryInfo(device, &memory) == NVML_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN,
      "nvmlDeviceGetMemoryInfo");
  std::printf("nvml_total=%llu\nnvml_free=%llu\nnvml_used=%llu\n", memory.total, memory.free,
              memory.used);
  nvmlMemory_v2_t memory2{};
  memory2.version = nvmlMemory_v2;
  check(nvmlDeviceGetMemoryInfo_v2(device, &memory2) == NVML_SUCCESS ? CUDA_SUCCESS
                                                                     : CUDA_ERROR_UNKNOWN,
        "nvmlDeviceGetMemoryInfo_v2");
  std::printf("nvml2_total=%llu\nnvml2_free=%llu\nnvml2_used=%llu\n", memory2.total, memory2.free,
              memory2.used);
  return 0;
}

// A kernel from the simulated module and a stream to launch it on.
struct LoadedKernel {
  CUfunction function = nullptr;
  CUstream stream = nullptr;
};

LoadedKernel load_kernel(const char* name) {
  start();
  LoadedKernel loaded;
  CUmodule module = nullptr;
  check(cuModuleLoadData(&module, "kernels"), "cuModuleLoadData");
  check(cuModuleGetFunction(&loaded.function, module, name), "cuModuleGetFunction");
  check(cuStreamCreate(&loaded.stream, 0), "cuStreamCreate");
  return loaded;
}

// Captures `count` launches of `blocks` blocks into a graph, ready to launch.
CUgraphExec capture(const LoadedKernel& kernel, int count, unsigned blocks) {
  CUgraph captured = nullptr;
  CUgraphExec graph = nullptr;
  check(cuStreamBeginCapture_v2(kernel.stream, 0), "cuStreamBeginCapture");
  for (int i = 0; i < count; ++i) {
    check(cuLaunchKernel(kernel.function, blocks, 1, 1, 128, 1, 1, 0, kernel.stream, nullptr,
                         nullptr),
          "captured launch");
  }
  check(cuStreamEndCapture(kernel.stream, &captured), "cuStreamEndCapture");
  check(cuGraphInstantiateWithFlags(&graph, captured, 0), "cuGraphInstantiate");
  return graph;
}

// Launches COUNT kernels named NAME (on the simulated GPU "k@2ms" runs 2 ms a wave) through
// one launch path, BLOCKS blocks each, then synchronises. Prints the wall-clock window and
// the GPU time between events recorded around the work.
int kernels(const std::string& mode, const char* name, int count, unsigned blocks) {
  const LoadedKernel kernel = load_kernel(name);
  CUfunction function = kernel.function;
  CUstream stream = kernel.stream;
  CUevent before = nullptr, after = nullptr;
  check(cuEventCreate(&before, 0), "cuEventCreate");
  check(cuEventCreate(&after, 0), "cuEventCreate");
  // A graph captures COUNT kernels once and is launched once.
  CUgraphExec graph = mode == "graph" ? capture(kernel, count, blocks) : nullptr;
  const std::uint64_t begin = monotonic_ns();
  check(cuEventRecord(before, stream), "cuEventRecord");
  if (mode == "graph") {
    check(cuGraphLaunch(graph, stream), "cuGraphLaunch");
  } else {
    for (int i = 0; i < count; ++i) {
      if (mode == "coop") {
        check(cuLaunchCooperativeKernel(function, blocks, 1, 1, 128, 1, 1, 0, stream, nullptr),
              "cuLaunchCooperativeKernel");
      } else if (mode == "ex") {
        CUlaunchConfig config{};
        config.gridDimX = blocks;
        config.gridDimY = config.gridDimZ = 1;
        config.blockDimX = 128;
        config.blockDimY = config.blockDimZ = 1;
        config.hStream = stream;
        check(cuLaunchKernelEx(&config, function, nullptr, nullptr), "cuLaunchKernelEx");
      } else {
        check(cuLaunchKernel(function, blocks, 1, 1, 128, 1, 1, 0, stream, nullptr, nullptr),
              "cuLaunchKernel");
      }
    }
  }
  check(cuEventRecord(after, stream), "cuEventRecord");
  std::printf("query_before_sync=%d\n", cuEventQuery(after));
  check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  const std::uint64_t end = monotonic_ns();
  float elapsed = 0;
  check(cuEventElapsedTime(&elapsed, before, after), "cuEventElapsedTime");
  std::printf("pid=%d\nbegin_ns=%llu\nend_ns=%llu\nelapsed_us=%.0f\n", getpid(),
              static_cast<unsigned long long>(begin), static_cast<unsigned long long>(end),
              elapsed * 1000.0);
  return 0;
}

// Keeps the device busy for SECONDS with kernels named NAME through one launch path, as a
// saturating workload does; prints its window.
int saturate(const std::string& mode, const char* name, double seconds) {
  const LoadedKernel kernel = load_kernel(name);
  CUfunction function = kernel.function;
  CUstream stream = kernel.stream;
  CUgraphExec graph = mode == "graph" ? capture(kernel, 4, 1) : nullptr;
  tessera::test::HostRecorder host;  // what the host withholds from this launching thread
  const std::uint64_t begin = monotonic_ns();
  const auto until = begin + static_cast<std::uint64_t>(seconds * 1e9);
  long launches = 0;
  CUevent batches[2] = {nullptr, nullptr};
  while (monotonic_ns() < until) {
    if (mode == "graph") {
      check(cuGraphLaunch(graph, stream), "cuGraphLaunch");
    } else if (mode == "coop") {
      check(cuLaunchCooperativeKernel(function, 1, 1, 1, 128, 1, 1, 0, stream, nullptr), "coop");
    } else {
      check(cuLaunchKernel(function, 1, 1, 1, 128, 1, 1, 0, stream, nullptr, nullptr),
            "cuLaunchKernel");
    }
    if (++launches == 1) {  // tell whoever waits for it that the workload is running
      std::printf("started\n");
      std::fflush(stdout);
    }
    // Keep the queue short, as a pipelined loop does: wait for the batch before last, so the
    // device always has the last batch to run and never idles for want of work.
    if (launches % 8 == 0) {
      CUevent& slot = batches[(launches / 8) % 2];
      if (slot != nullptr) check(cuEventSynchronize(slot), "cuEventSynchronize");
      if (slot == nullptr) check(cuEventCreate(&slot, 0), "cuEventCreate");
      check(cuEventRecord(slot, stream), "cuEventRecord");
    }
  }
  check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  std::printf("pid=%d\nbegin_ns=%llu\nend_ns=%llu\nlaunches=%ld\n", getpid(),
              static_cast<unsigned long long>(begin),
              static_cast<unsigned long long>(monotonic_ns()), launches);
  host.print();
  return 0;
}

// What tools that watch a GPU ask NVML with the older names: the first handle lookup, the
// version-1 process list, and per-process utilisation, before and after COUNT kernels NAME.
int nvml_peers(const char* name, int count) {
  const LoadedKernel kernel = load_kernel(name);
  CUdeviceptr held = 0;  // a process NVML lists holds memory on the device
  check(cuMemAlloc_v2(&held, 1 << 20), "cuMemAlloc");
  check(nvmlInit_v2() == NVML_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, "nvmlInit");
  nvmlDevice_t device = nullptr;
  std::printf("handle_status=%d\n", nvmlDeviceGetHandleByIndex(0, &device));
  auto utilization = [&](const char* when) {
    nvmlProcessUtilizationSample_t samples[16];
    unsigned samples_count = 0;
    const nvmlReturn_t sized = nvmlDeviceGetProcessUtilization(device, nullptr, &samples_count, 0);
    std::printf("%s_size_status=%d\n%s_size=%u\n", when, sized, when, samples_count);
    samples_count = 16;
    const nvmlReturn_t status = nvmlDeviceGetProcessUtilization(device, samples, &samples_count, 0);
    std::printf("%s_status=%d\n", when, status);
    for (unsigned i = 0; status == NVML_SUCCESS && i < samples_count; ++i) {
      if (samples[i].pid == static_cast<unsigned>(getpid())) {
        std::printf("%s_sm_util=%u\n", when, samples[i].smUtil);
      }
    }
  };
  utilization("idle");
  const std::uint64_t first_launch_ns = monotonic_ns();
  for (int i = 0; i < count; ++i) {
    check(cuLaunchKernel(kernel.function, 1, 1, 1, 128, 1, 1, 0, kernel.stream, nullptr, nullptr),
          "cuLaunchKernel");
  }
  check(cuStreamSynchronize(kernel.stream), "cuStreamSynchronize");
  std::printf("busy_span_ns=%llu\n",
              static_cast<unsigned long long>(monotonic_ns() - first_launch_ns));
  utilization("busy");
  nvmlProcessInfo_v1_t infos[16];
  unsigned infos_count = 16;
  std::printf("processes_status=%d\n",
              nvmlDeviceGetComputeRunningProcesses(device, &infos_count, infos));
  for (unsigned i = 0; i < infos_count; ++i) {
    if (infos[i].pid == static_cast<unsigned>(getpid())) std::printf("listed_self=1\n");
  }
  return 0;
}

// An interactive workload: COUNT times, launches one kernel named NAME and waits for it,
// then idles IDLE_US. Prints its window, when it made each launch call (to be matched with
// the device's record of when each kernel finished) and the run-queue delay the host added to
// each launch call.
// COUNT kernels NAME, each awaited, then idle: IDLE_US each time, or with `poisson`, drawn
// from an exponential distribution of that mean (the same draws every run: seed 42).
int latency(const char* name, int count, std::uint64_t idle_us, bool poisson) {
  std::mt19937_64 draws(42);
  std::exponential_distribution<double> idle_draw(1.0 / static_cast<double>(idle_us));
  const LoadedKernel kernel = load_kernel(name);
  const std::string own = "/proc/self/task/" + std::to_string(syscall(SYS_gettid)) + "/schedstat";
  const int schedstat = open(own.c_str(), O_RDONLY | O_CLOEXEC);
  const int machine_stat = open("/proc/stat", O_RDONLY | O_CLOEXEC);
  tessera::test::HostRecorder host;
  std::vector<std::uint64_t> launched, call_delay;
  const std::uint64_t begin = monotonic_ns();
  for (int i = 0; i < count; ++i) {
    const std::uint64_t delay_before = tessera::test::sample_host(schedstat, machine_stat).delay_ns;
    launched.push_back(monotonic_ns());
    check(cuLaunchKernel(kernel.function, 1, 1, 1, 128, 1, 1, 0, kernel.stream, nullptr, nullptr),
          "cuLaunchKernel");
    call_delay.push_back(tessera::test::sample_host(schedstat, machine_stat).delay_ns -
                         delay_before);
    check(cuStreamSynchronize(kernel.stream), "cuStreamSynchronize");
    const double idle = poisson ? idle_draw(draws) : static_cast<double>(idle_us);
    tessera::sleep_until_ns(monotonic_ns() + static_cast<std::uint64_t>(idle * 1000));
  }
  std::printf("pid=%d\nbegin_ns=%llu\nend_ns=%llu\n", getpid(),
              static_cast<unsigned long long>(begin),
              static_cast<unsigned long long>(monotonic_ns()));
  for (const auto& [key, values] :
       {std::pair{"launched_ns", &launched}, std::pair{"call_delay_ns", &call_delay}}) {
    std::printf("%s=", key);
    for (std::uint64_t value : *values)
      std::printf("%llu,", static_cast<unsigned long long>(value));
    std::printf("\n");
  }
  host.print();
  return 0;
}

int fill(std::size_t chunk) {
  start();
  print_view("");
  std::vector<CUdeviceptr> held;
  CUresult result = CUDA_SUCCESS;
  while (true) {
    CUdeviceptr p = 0;
    result = cuMemAlloc_v2(&p, chunk);
    if (result != CUDA_SUCCESS) break;
    held.push_back(p);
  }
  std::printf("allocated=%zu\nerror=%d\n", held.size() * chunk, result);
  for (CUdeviceptr p : held) check(cuMemFree_v2(p), "cuMemFree");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string command = argc > 1 ? argv[1] : "";
  auto number = [&](int index) { return std::strtoull(argv[index], nullptr, 10); };
  if (command == "info") {
    start();
    print_view("");
    std::size_t total = 0;
    check(cuDeviceTotalMem_v2(&total, 0), "cuDeviceTotalMem");
    std::printf("device_total=%zu\n", total);
    int count = 0, sms = 0;
    check(cuDeviceGetCount(&count), "cuDeviceGetCount");
    check(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0),
          "cuDeviceGetAttribute");
    char name[128] = {};
    check(cuDeviceGetName(name, sizeof name, 0), "cuDeviceGetName");
    std::printf("device_count=%d\ndevice_sms=%d\ndevice_name=%s\n", count, sms, name);
    return 0;
  }
  if (command == "init-context") {  // initialise and retain the primary context
    CUcontext context = nullptr;
    check(cuInit(0), "cuInit");
    std::printf("context_result=%d\n", cuDevicePrimaryCtxRetain(&context, 0));
    return 0;
  }
  if (command == "init") {  // the first CUDA call and nothing else
    std::printf("result=%d\n", cuInit(0));
    return 0;
  }
  if (command == "path" && argc >= 4) {
    start();
    const bool keep = argc > 4 && std::string(argv[4]) == "keep";
    const int status = allocate_via(argv[2], number(3), keep);
    print_view("after_");
    return status;
  }
  if (command == "lookup" && argc >= 4) return lookup(argv[2], number(3));
  if (command == "stress" && argc >= 6) {
    return stress(static_cast<int>(number(2)), static_cast<int>(number(3)), number(4),
                  static_cast<unsigned>(number(5)));
  }
  if (command == "fill" && argc >= 3) return fill(number(2));
  if (command == "pool-cache" && argc >= 3) return pool_cache(number(2));
  if (command == "nvml-peers" && argc >= 4) return nvml_peers(argv[2], static_cast<int>(number(3)));
  if (command == "many-pools" && argc >= 4) {
    return many_pools(static_cast<int>(number(2)), number(3));
  }
  if (command == "saturate" && argc >= 5) return saturate(argv[2], argv[3], std::atof(argv[4]));
  if (command == "latency" && argc >= 5) {
    return latency(argv[2], static_cast<int>(number(3)), number(4),
                   argc > 5 && std::string(argv[5]) == "poisson");
  }
  if (command == "kernels" && argc >= 5) {
    return kernels(argv[2], argv[3], static_cast<int>(number(4)),
                   argc > 5 ? static_cast<unsigned>(number(5)) : 1u);
  }
  if (command == "processes" && argc >= 3) {  // NVML's process list, holding BYTES
    start();
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, number(2)), "cuMemAlloc");
    check(nvmlInit_v2() == NVML_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, "nvmlInit");
    nvmlDevice_t device = nullptr;
    nvmlDeviceGetHandleByIndex_v2(0, &device);
    nvmlProcessInfo_t infos[64];
    unsigned count = 64;
    const nvmlReturn_t status = nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos);
    std::printf("status=%d\nprocesses=%u\n", status, count);
    for (unsigned i = 0; i < count; ++i) std::printf("pid=%u\n", infos[i].pid);
    std::printf("self=%d\n", getpid());
    return 0;
  }
  if (command == "nvml" && argc >= 3) {  // NVML's view, with BYTES held through CUDA
    start();
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, number(2)), "cuMemAlloc");
    return nvml_view();
  }
  if (command == "churn" && argc >= 3) return churn(static_cast<unsigned>(number(2)));
  if (command == "hold" && argc >= 3) {  // allocate, report, wait for stdin to close
    start();
    CUdeviceptr p = 0;
    std::printf("result=%d\n", cuMemAlloc_v2(&p, number(2)));
    print_view("");
    char buffer[16];
    while (read(STDIN_FILENO, buffer, sizeof buffer) > 0) {
    }
    return 0;
  }
  if (command == "two-step" && argc >= 4) {  // allocate, report; on a line, allocate again
    start();
    CUdeviceptr p = 0, q = 0;
    std::printf("result=%d\n", cuMemAlloc_v2(&p, number(2)));
    char line[16];
    if (std::fgets(line, sizeof line, stdin) == nullptr) return 3;
    std::printf("second_result=%d\n", cuMemAlloc_v2(&q, number(3)));
    char buffer[16];
    while (read(STDIN_FILENO, buffer, sizeof buffer) > 0) {
    }
    return 0;
  }
  if (command == "fork" && argc >= 4) {
    start();
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, number(2)), "parent cuMemAlloc");
    const pid_t child = fork();
    if (child == 0) {
      start();  // CUDA state does not survive fork: the child starts over
      print_view("child_");
      CUdeviceptr q = 0;
      std::printf("child_result=%d\n", cuMemAlloc_v2(&q, number(3)));
      print_view("child_after_");
      std::fflush(stdout);
      _exit(0);  // without freeing: its memory must be reclaimed when it is gone
    }
    int status = 0;
    waitpid(child, &status, 0);
    print_view("parent_");
    return 0;
  }
  if (command == "exec" && argc >= 3) {  // allocate, then replace this image
    start();
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, number(2)), "cuMemAlloc");
    execl("/proc/self/exe", argv[0], "info", static_cast<char*>(nullptr));
    return 4;
  }
  std::fprintf(stderr,
               "usage: cuda_worker info|init|path NAME BYTES [keep]|lookup MODE BYTES|"
               "stress THREADS ITERATIONS MAX_BYTES SEED|fill CHUNK|churn SEED|hold BYTES|"
               "two-step BYTES BYTES|fork PARENT_BYTES CHILD_BYTES|exec BYTES|pool-cache "
               "BYTES|nvml BYTES\n");
  return 2;
}
