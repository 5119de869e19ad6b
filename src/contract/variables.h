// The environment Tessera gives a container (or a `tessera run` group) and the hook reads: the
// name of every variable, in one place. The node agent and `tessera run` write them; the hook,
// through common/limits.h and common/priority.h, reads them. Guest-safe: names only.
#pragma once

namespace tessera::contract {

// Tessera's own.
inline constexpr const char* kLedgerVariable = "TESSERA_LEDGER";  // the group's ledger file
// Memory limits: "8GiB" for every device, or "0=8GiB,1=4GiB" (common/limits.h).
inline constexpr const char* kMemoryLimitVariable = "TESSERA_MEMORY_LIMIT";
// Compute shares in percent of a device's time: "30", or "0=30,1=50".
inline constexpr const char* kCoreLimitVariable = "TESSERA_CORE_LIMIT";
inline constexpr const char* kBurstVariable = "TESSERA_CORE_BURST";   // 0 or 1
inline constexpr const char* kPriorityVariable = "TESSERA_PRIORITY";  // high or low
inline constexpr const char* kPriorityToleranceVariable = "TESSERA_PRIORITY_TOLERANCE";
// How long the hook waits for its ledger to be written (a container started before the node
// agent's PreStartContainer has finished), in milliseconds.
inline constexpr const char* kLedgerWaitVariable = "TESSERA_LEDGER_WAIT_MS";
// How much the hook and Tessera's own programs log: off, error, warn, info or debug
// (common/log.h for the hook, base/log.h for the programs, which differ in their default).
inline constexpr const char* kLogLevelVariable = "TESSERA_LOG_LEVEL";

// HAMi's, read alike so containers set up for HAMi work unchanged.
inline constexpr const char* kHamiMemoryLimitVariable = "CUDA_DEVICE_MEMORY_LIMIT";  // and _<i>
inline constexpr const char* kHamiCoreLimitVariable = "CUDA_DEVICE_SM_LIMIT";        // and _<i>
inline constexpr const char* kHamiSharedCacheVariable = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
inline constexpr const char* kHamiPriorityVariable = "CUDA_TASK_PRIORITY";  // 0 high, 1 low

// NVIDIA's container runtime: which GPUs the container gets.
inline constexpr const char* kVisibleDevicesVariable = "NVIDIA_VISIBLE_DEVICES";

// gpushare's (Alibaba's device plugin), given to aliyun.com/gpu-mem containers.
inline constexpr const char* kGpushareIndexVariable = "ALIYUN_COM_GPU_MEM_IDX";
inline constexpr const char* kGpusharePodVariable = "ALIYUN_COM_GPU_MEM_POD";
inline constexpr const char* kGpushareContainerVariable = "ALIYUN_COM_GPU_MEM_CONTAINER";
inline constexpr const char* kGpushareDeviceVariable = "ALIYUN_COM_GPU_MEM_DEV";

// NVIDIA MPS: a client's share of the GPU's threads, and its memory limit per device
// ("0=1G,1=2G"); the DRA driver sets them for MPS claims, the simulated MPS client reads them.
inline constexpr const char* kMpsThreadPercentageVariable = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
inline constexpr const char* kMpsMemoryLimitVariable = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

}  // namespace tessera::contract
