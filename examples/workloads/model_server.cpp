// An inference server: loads its weights once, then serves requests, each taking activation
// memory from the stream-ordered allocator and giving it back.
// Usage: model_server WEIGHTS REQUESTS ACTIVATIONS   e.g. model_server 6GiB 500 256MiB
#include <unistd.h>

#include <string>

#include "common.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: model_server WEIGHTS REQUESTS ACTIVATIONS\n");
    return 2;
  }
  const std::size_t weights = parse_example_size(argv[1]);
  const int requests = std::atoi(argv[2]);
  const std::size_t activations = parse_example_size(argv[3]);
  open_gpu();
  std::size_t free = 0, total = 0;
  require(cuMemGetInfo_v2(&free, &total), "cuMemGetInfo");
  std::printf("model_server: sees a %.1f GiB GPU\n", gib(total));

  CUdeviceptr model = 0;
  require(cuMemAlloc_v2(&model, weights), "loading weights");
  CUmodule module = nullptr;
  CUfunction forward = nullptr;
  require(cuModuleLoadData(&module, "model"), "cuModuleLoadData");
  require(cuModuleGetFunction(&forward, module, "forward"), "cuModuleGetFunction");
  int served = 0, refused = 0;
  for (int request = 0; request < requests; ++request) {
    CUdeviceptr scratch = 0;
    const CUresult result = cuMemAllocAsync(&scratch, activations, nullptr);
    if (result == CUDA_ERROR_OUT_OF_MEMORY) {
      ++refused;
      continue;
    }
    require(result, "cuMemAllocAsync");
    require(cuLaunchKernel(forward, 128, 1, 1, 256, 1, 1, 0, nullptr, nullptr, nullptr), "launch");
    require(cuStreamSynchronize(nullptr), "cuStreamSynchronize");
    usleep(2000);  // the time a real forward pass takes; simulated kernels take none yet
    require(cuMemFreeAsync(scratch, nullptr), "cuMemFreeAsync");
    ++served;
  }
  std::printf("model_server: %.1f GiB of weights, served %d of %d requests (%d refused)\n",
              gib(weights), served, requests, refused);
  require(cuMemFree_v2(model), "cuMemFree");
  return refused == 0 ? 0 : 1;
}
