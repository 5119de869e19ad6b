// Launch entry points. Every path into the device's time is interposed here (kernels,
// Ex, cooperative, graphs, host functions, and their per-thread-stream forms) so that a
// compute share applies to all of them; with no share configured each forwards at once.
#include "hook/hook.h"

using namespace tessera::abi;

#define FORWARD_LAUNCH(name, params, arguments) \
  HOOK_EXPORT CUresult name params {            \
    HOOK_ENTER();                               \
    return state.real.name arguments;           \
  }

#define GRID_ARGUMENTS gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes

FORWARD_LAUNCH(cuLaunchKernel,
               (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams,
                void** extra),
               (f, GRID_ARGUMENTS, hStream, kernelParams, extra))
FORWARD_LAUNCH(cuLaunchKernel_ptsz,
               (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams,
                void** extra),
               (f, GRID_ARGUMENTS, hStream, kernelParams, extra))
FORWARD_LAUNCH(cuLaunchKernelEx,
               (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra),
               (config, f, kernelParams, extra))
FORWARD_LAUNCH(cuLaunchKernelEx_ptsz,
               (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra),
               (config, f, kernelParams, extra))
FORWARD_LAUNCH(cuLaunchCooperativeKernel,
               (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams),
               (f, GRID_ARGUMENTS, hStream, kernelParams))
FORWARD_LAUNCH(cuLaunchCooperativeKernel_ptsz,
               (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams),
               (f, GRID_ARGUMENTS, hStream, kernelParams))
FORWARD_LAUNCH(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))
FORWARD_LAUNCH(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream),
               (hGraphExec, hStream))
FORWARD_LAUNCH(cuLaunchHostFunc, (CUstream hStream, CUhostFn fn, void* userData),
               (hStream, fn, userData))
FORWARD_LAUNCH(cuLaunchHostFunc_ptsz, (CUstream hStream, CUhostFn fn, void* userData),
               (hStream, fn, userData))
