// A trainer that takes all the memory it can: it grows its cache chunk by chunk until the
// GPU says no, then backs off one chunk and trains with what it has. Under Tessera the
// "no" is a clean CUDA_ERROR_OUT_OF_MEMORY at its group's limit; its neighbours never
// notice. Usage: greedy_trainer CHUNK   e.g. greedy_trainer 1GiB
#include <vector>

#include "common.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: greedy_trainer CHUNK\n");
    return 2;
  }
  const std::size_t chunk = parse_example_size(argv[1]);
  open_gpu();
  std::size_t free = 0, total = 0;
  require(cuMemGetInfo_v2(&free, &total), "cuMemGetInfo");
  std::printf("greedy_trainer: sees a %.1f GiB GPU with %.1f GiB free\n", gib(total), gib(free));
  std::vector<CUdeviceptr> cache;
  CUresult result = CUDA_SUCCESS;
  while (result == CUDA_SUCCESS) {
    CUdeviceptr block = 0;
    result = cuMemAlloc_v2(&block, chunk);
    if (result == CUDA_SUCCESS) cache.push_back(block);
  }
  std::printf("greedy_trainer: grew to %.1f GiB, then got %s; backing off one chunk\n",
              gib(cache.size() * chunk), error_name(result));
  if (result != CUDA_ERROR_OUT_OF_MEMORY) return 1;
  if (!cache.empty()) {
    require(cuMemFree_v2(cache.back()), "cuMemFree");
    cache.pop_back();
  }
  for (CUdeviceptr block : cache) require(cuMemFree_v2(block), "cuMemFree");
  return 0;
}
