// MPS for the node agent: one nvidia-cuda-mps-control daemon per resource shared through
// sharing.mps, as NVIDIA's plugin runs them (pipe and log directories under mpsRoot, the
// defaults each client starts with: 100/replicas percent of the SMs and memory/replicas
// pinned per GPU), but supervised: each daemon's process is checked every second and its pipe
// every five, and one that died or hangs makes its GPUs' devices unhealthy, is restarted, and
// they recover once it answers again.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "base/mutex.h"
#include "node/allocation.h"
#include "node/config.h"
#include "node/container_grants.h"
#include "node/health.h"
#include "node/nvml.h"
#include "node/resources.h"

namespace tessera::node {

// What one daemon serves, and where.
struct MpsDaemonSpec {
  std::string resource;                     // nvidia.com/gpu, nvidia.com/gpu.shared, ...
  std::vector<int> gpus;                    // inventory indices, in the daemon's device order
  std::vector<std::string> uuids;           // its CUDA_VISIBLE_DEVICES
  std::vector<std::uint64_t> pinned_bytes;  // per GPU: its memory / replicas
  int thread_percentage = 100;              // 100 / replicas
  std::string pipe_dir, log_dir;            // <mpsRoot>/<resource>/pipe and /log
  std::string shm_dir;                      // <mpsRoot>/shm
  bool operator==(const MpsDaemonSpec&) const = default;
};

// The daemons a served config needs: one per MPS resource.
std::vector<MpsDaemonSpec> mps_daemon_specs(const Inventory& inventory, const PluginConfig& config,
                                            const ResourceMap& map);

// What a container of an MPS resource gets besides its devices: the daemon's pipe directory
// (mounted, and named by CUDA_MPS_PIPE_DIRECTORY) and the MPS shared memory as /dev/shm.
void add_mps_access(ContainerAllocation& allocation, const PluginConfig& config,
                    const std::string& resource);

// A client's pinned memory on a GPU of `memory_bytes` shared by `replicas`: NVIDIA's
// memory / replicas, in whole MiB as the daemon is told it.
std::uint64_t mps_replica_memory(std::uint64_t memory_bytes, int replicas);

// The limits a container of an MPS resource is held to across all its processes (MPS holds
// each process alone): on each GPU, the pinned memory of the replicas it was given. No compute
// share: MPS's thread percentage already caps its SMs.
ContainerGrant mps_container_grant(const Inventory& inventory, const Resource& resource,
                                   const std::vector<std::string>& ids);

// Sends one control command to the daemon of `pipe_dir`; its answer, or nothing if no daemon
// answered within `timeout`.
std::optional<std::string> mps_command(const std::string& pipe_dir, const std::string& command,
                                       std::chrono::milliseconds timeout);

class MpsSupervisor {
 public:
  // `control` is the nvidia-cuda-mps-control to run (looked up on PATH without a '/').
  // `changed` is called after any GPU's health changed.
  MpsSupervisor(std::string control, HealthBoard& board, std::function<void()> changed,
                base::Reporter report, std::chrono::milliseconds check_every);
  ~MpsSupervisor();  // stops every daemon
  MpsSupervisor(const MpsSupervisor&) = delete;
  MpsSupervisor& operator=(const MpsSupervisor&) = delete;

  // Serves exactly these daemons: those no longer wanted are stopped, new ones started, the
  // rest left running. Returns once each new daemon answered (or was found down).
  void apply(const std::vector<MpsDaemonSpec>& specs) EXCLUDES(mutex_);

 private:
  struct Daemon {
    MpsDaemonSpec spec;
    pid_t pid = 0;
  };
  // Starts the daemon and gives it its defaults; false (with the reason) if it does not answer.
  bool start(Daemon& daemon, std::string& why);
  void stop(Daemon& daemon);
  void mark(Daemon& daemon, const std::string& why);  // "" : up
  void run() EXCLUDES(mutex_);

  std::string control_;
  HealthBoard& board_;
  std::function<void()> changed_;
  base::Reporter report_;
  std::chrono::milliseconds check_every_;
  // Held while daemons start, stop or are checked, so apply() and the checks never overlap.
  base::Mutex mutex_;
  base::CondVar wake_;
  std::vector<Daemon> daemons_ GUARDED_BY(mutex_);
  std::uint64_t checks_ GUARDED_BY(mutex_) = 0;
  bool stopping_ GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace tessera::node
