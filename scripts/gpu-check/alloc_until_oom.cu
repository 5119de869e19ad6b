// GPU check: what a CUDA runtime program sees and gets under a Tessera quota.
// Usage: alloc_until_oom malloc|async|managed CHUNK_MIB
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const char* mode = argv[1];
  const size_t chunk = std::strtoull(argv[2], nullptr, 10) << 20;
  size_t free = 0, total = 0;
  cudaError_t status = cudaMemGetInfo(&free, &total);
  if (status != cudaSuccess) {
    std::printf("total=0\nallocated=0\nerror=%s\n", cudaGetErrorName(status));
    return 0;
  }
  std::vector<void*> held;
  cudaStream_t stream = nullptr;
  while (true) {
    void* pointer = nullptr;
    if (std::strcmp(mode, "async") == 0) {
      status = cudaMallocAsync(&pointer, chunk, stream);
      if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
    } else if (std::strcmp(mode, "managed") == 0) {
      status = cudaMallocManaged(&pointer, chunk);
    } else {
      status = cudaMalloc(&pointer, chunk);
    }
    if (status != cudaSuccess) break;
    held.push_back(pointer);
  }
  std::printf("total=%zu\nallocated=%zu\nerror=%s\n", total, held.size() * chunk,
              cudaGetErrorName(status));
  return 0;
}
