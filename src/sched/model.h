// The placement engine's model of a cluster: nodes with their CPU, memory, GPUs and MIG
// devices, and pods with what they ask for. Traces (trace.h), the extender (from Kubernetes
// objects) and tests all describe clusters in these terms.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera::sched {

inline constexpr int kMilli = 1000;  // milli-GPU in one GPU
inline constexpr int kMostGpusPerNode = 16;

// MIG devices of one profile on a node (the node agent's mixed strategy serves them by
// profile, as nvidia.com/mig-<profile>).
struct MigDevices {
  std::string profile;  // as Kubernetes resources spell it: "1g.10gb", "1g.10gb.me"
  int count = 0;
  int milli = 0;  // each device's share of its GPU, in milli-GPU
  bool operator==(const MigDevices&) const = default;
};

struct NodeSpec {
  std::string name;
  std::int64_t cpu_milli = 0;
  std::int64_t memory_mib = 0;
  int gpus = 0;
  std::string model;  // empty for a CPU-only node
  // GPUs that take only whole-GPU pods (a bit each): served whole by the node agent, where a
  // fractional pod's limits could not be enforced.
  std::uint16_t whole_only_gpus = 0;
  std::vector<MigDevices> mig = {};  // GPUs cut into MIG devices; not among `gpus`
  // For dynamic MIG in the simulator (dynamic_mig.h): the last this many of `gpus` can be put
  // in MIG mode and cut.
  int mig_capable_gpus = 0;
};

struct PodSpec {
  std::string name;
  std::int64_t cpu_milli = 0;
  std::int64_t memory_mib = 0;
  int gpus = 0;                     // 0: CPU only
  int gpu_milli = 0;                // per GPU; < 1000 only with gpus == 1 (a sharing pod)
  std::vector<std::string> models;  // allowed GPU models; empty: any
  std::int64_t creation_time = -1;  // seconds; -1 where the trace has none
  std::int64_t deletion_time = -1;
  std::vector<std::pair<std::string, int>> mig = {};  // MIG devices asked for, by profile
  std::string qos;  // the trace's qos column (LS, BE, Guaranteed, Burstable); empty if none

  bool shares_gpu() const { return gpus == 1 && gpu_milli < kMilli; }
  std::int64_t gpu_milli_total() const { return std::int64_t{gpus} * gpu_milli; }
};

}  // namespace tessera::sched
