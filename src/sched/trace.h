// Cluster traces in the Alibaba GPU-sharing format (data/openb in the repository): node lists
// (sn,cpu_milli,memory_mib,gpu,model) and pod lists (name,cpu_milli,memory_mib,num_gpu,
// gpu_milli[,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time]).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sched/model.h"

namespace tessera::sched {

// Both throw std::runtime_error naming the file, line and column of the first bad field.
std::vector<NodeSpec> read_nodes(const std::string& path);
std::vector<PodSpec> read_pods(const std::string& path);
// The priority (Kubernetes' spec.priority: higher preempts lower) that `tessera sim
// --preemption` gives a pod of the trace's qos: latency-sensitive (LS) and Guaranteed pods
// 1000, Burstable 500, best-effort (BE) and the rest 0.
std::int32_t priority_of_qos(std::string_view qos);
// Writes pods as read_pods reads them (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos);
// throws std::runtime_error naming the file if it cannot be written.
void write_pods(const std::string& path, const std::vector<PodSpec>& pods);

}  // namespace tessera::sched
