// An allocator in the style of PyTorch's expandable segments: reserve a large virtual range
// once, then back it with physical memory (cuMemCreate + cuMemMap) on a worker thread as
// the model grows, until the GPU refuses. Usage: vmm_allocator STEP   e.g. vmm_allocator 512MiB
#include <thread>
#include <vector>

#include "common.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: vmm_allocator STEP\n");
    return 2;
  }
  const std::size_t step = parse_example_size(argv[1]);
  CUcontext context = open_gpu();
  int exit_code = 1;
  std::thread grower([&] {
    require(cuCtxSetCurrent(context), "cuCtxSetCurrent");
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    const std::size_t reserve = 256ull << 30;
    CUdeviceptr base = 0;
    require(cuMemAddressReserve(&base, reserve, 0, 0, 0), "cuMemAddressReserve");
    std::size_t mapped = 0;
    CUresult result = CUDA_SUCCESS;
    while (mapped + step <= reserve) {
      CUmemGenericAllocationHandle handle = 0;
      result = cuMemCreate(&handle, step, &prop, 0);
      if (result != CUDA_SUCCESS) break;
      require(cuMemMap(base + mapped, step, 0, handle, 0), "cuMemMap");
      require(cuMemRelease(handle), "cuMemRelease");  // the mapping keeps it alive
      mapped += step;
    }
    std::printf("vmm_allocator: mapped %.1f GiB, then got %s\n", gib(mapped), error_name(result));
    require(cuMemUnmap(base, mapped), "cuMemUnmap");
    std::size_t free = 0, total = 0;
    require(cuMemGetInfo_v2(&free, &total), "cuMemGetInfo");
    std::printf("vmm_allocator: after unmapping, %.1f GiB of %.1f GiB free\n", gib(free),
                gib(total));
    exit_code = result == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1;
  });
  grower.join();
  return exit_code;
}
