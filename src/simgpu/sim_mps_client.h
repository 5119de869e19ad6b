// The simulated driver's side of MPS (sim_mps_client.cpp).
#pragma once

#include "cuda_abi/cuda_abi.h"
#include "simgpu/sim_mps.h"

namespace tessera::sim {

struct MpsClient {
  int fd = -1;  // the connection to the control daemon; -1: not an MPS client
  MpsClientLimits limits;
};

// At cuInit: attaches to the control daemon of CUDA_MPS_PIPE_DIRECTORY (default
// /tmp/nvidia-mps) if its control socket is there. CUDA_SUCCESS when attached or when there
// is no socket (no MPS); CUDA_ERROR_MPS_CONNECTION_FAILED when the socket does not answer.
abi::CUresult attach_mps(MpsClient& client);
// Whether an attached client's daemon has gone.
bool mps_daemon_gone(const MpsClient& client);
// After fork: the child is no client until it initialises CUDA again.
void forget_mps(MpsClient& client);

}  // namespace tessera::sim
