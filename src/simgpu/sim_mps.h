// The simulated MPS: what the simulated nvidia-cuda-mps-control (sim_mps_control.cpp) and the
// simulated driver's MPS clients (sim_mps_client.cpp) share.
//
// As NVIDIA's, the control daemon listens on <CUDA_MPS_PIPE_DIRECTORY>/control (default
// /tmp/nvidia-mps) and logs to <CUDA_MPS_LOG_DIRECTORY>/control.log (default
// /var/log/nvidia-mps). Control commands are one line each, answered and closed. A CUDA
// process that finds the control socket attaches with "tessera-attach <pid>", is answered
// with its server ("server <pid>") and the daemon's defaults ("threads <percent>", "limit
// <ordinal> <bytes>" lines), then "end", and keeps the connection open for as long as it is a
// client: when the daemon goes, its clients see the connection close.
#pragma once

#include <cstdint>

#include "common/limits.h"

namespace tessera::sim {

inline constexpr const char* kMpsDefaultPipeDirectory = "/tmp/nvidia-mps";
inline constexpr const char* kMpsDefaultLogDirectory = "/var/log/nvidia-mps";
inline constexpr const char* kMpsAttach = "tessera-attach";
inline constexpr std::size_t kMpsMostLine = 256;

// Parses "2G", "512M", "1024K", "4096" (bytes) as NVIDIA's pinned-memory limits are written;
// false for anything else, or for more than 1 PiB.
bool parse_mps_memory(const char* text, std::uint64_t& bytes);

// What an MPS client is held to (the daemon's defaults, lowered by the client's own
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT).
struct MpsClientLimits {
  std::int32_t server = 0;  // the PID its kernels run under, beside the other clients'
  double thread_percentage = 100;
  std::uint64_t pinned_bytes[kMostDevices] = {};  // by device ordinal; 0: none
};

}  // namespace tessera::sim
