// Small helpers shared by the example workloads: they are ordinary driver-API programs
// that know nothing about Tessera.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_abi/cuda_abi.h"

using namespace tessera::abi;

#define EXAMPLE_DECLARE(name, params) extern "C" CUresult name params;
TESSERA_CUDA_HOOKED(EXAMPLE_DECLARE)
TESSERA_CUDA_PASSTHROUGH(EXAMPLE_DECLARE)
#undef EXAMPLE_DECLARE

inline const char* error_name(CUresult result) {
  const char* name = "unknown";
  cuGetErrorName(result, &name);
  return name;
}

inline void require(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s failed: %s\n", what, error_name(result));
    std::exit(1);
  }
}

inline CUcontext open_gpu() {
  require(cuInit(0), "cuInit");
  CUcontext context = nullptr;
  require(cuDevicePrimaryCtxRetain(&context, 0), "cuDevicePrimaryCtxRetain");
  require(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  return context;
}

inline double gib(std::size_t bytes) {
  return static_cast<double>(bytes) / (1ull << 30);
}

// "8GiB"-style sizes for the examples' options (whole GiB or MiB only).
inline std::size_t parse_example_size(const std::string& text) {
  const std::size_t number = std::strtoull(text.c_str(), nullptr, 10);
  if (text.find("GiB") != std::string::npos) return number << 30;
  if (text.find("MiB") != std::string::npos) return number << 20;
  return number;
}
