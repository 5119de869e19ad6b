// Pod and node objects as the API server and kube-scheduler send them, with their
// annotations (tessera.io/assignment on pods, tessera.io/gpus on nodes): whatever the JSON,
// reading it gives a checked object or a std::runtime_error, and what is accepted is in range.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "extender/cluster_objects.h"
#include "fuzz_input.h"
#include "kube/json_input.h"

using namespace tessera::extender;
using tessera::fuzz::broken;
using tessera::kube::parse_outside_json;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nlohmann::json object;
  try {
    object = parse_outside_json(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const std::runtime_error&) {
    return 0;  // not JSON, or nested too deep: refused before anything reads it
  }
  try {
    const NodeInfo node = node_from_json(object);
    if (node.spec.gpus < 0 || node.spec.gpus > kMostGpusPerNode) broken("node GPU count");
    if (node.spec.cpu_milli < 0 || node.spec.memory_mib < 0) broken("node capacity");
    if (node.spec.name.size() > kMostNameLength) broken("node name length");
    if (node.spec.mig.size() > static_cast<std::size_t>(tessera::sched::kMostMigProfilesPerNode))
      broken("node MIG profiles");
    for (const auto& devices : node.spec.mig) {
      if (devices.profile.empty() || devices.profile.size() > 32 || devices.count < 1 ||
          devices.milli < 1 || devices.milli > kMilli) {
        broken("node MIG devices");
      }
    }
    // What the reader accepts, the engine takes: its limits are the reader's.
    try {
      const Cluster cluster({node.spec});
      if (cluster.gpu_milli_total() < 0) broken("node capacity in the engine");
    } catch (const std::invalid_argument&) {
      broken("the engine refuses a node the reader accepted");
    }
  } catch (const std::runtime_error&) {
  }
  try {
    const PodRequest pod = pod_from_json(object);
    if (pod.gpus < 0 || pod.cpu_milli < 0 || pod.memory_mib < 0 || pod.gpumem_mib < 0) {
      broken("pod request negative");
    }
    if (pod.gpumem_percent < 0 || pod.gpumem_percent > 100 || pod.gpucores < 0 ||
        pod.gpucores > 100) {
      broken("pod percentages");
    }
    if (pod.mig.size() > 16) broken("pod MIG profiles");
    const bool gpushare =
        std::any_of(pod.containers.begin(), pod.containers.end(),
                    [](const auto& container) { return container.gpushare_gib > 0; });
    if (gpushare && pod.gpus != 1) broken("a gpushare pod is not one GPU's GiB");
    for (const PodRequest::Container& container : pod.containers) {
      if (container.gpus < 0 || container.gpumem_mib < 0 || container.gpucores < 0 ||
          container.gpushare_gib < 0 || container.hami_priority < -1 ||
          container.hami_priority > 1) {
        broken("a container's own request");
      }
      (void)tessera::kube::container_priority(pod, container);
    }
    for (const auto& [profile, count] : pod.mig) {
      if (profile.empty() || profile.size() > 32 || count < 0) broken("pod MIG request");
    }
  } catch (const std::runtime_error&) {
  }
  // The annotation's value is a string holding JSON; fuzz both the string and the object.
  for (const nlohmann::json& annotation :
       {object, nlohmann::json(std::string(reinterpret_cast<const char*>(data), size))}) {
    try {
      const RecordedAssignment assignment = assignment_from_annotation(annotation);
      if (assignment.gpus.size() > static_cast<std::size_t>(kMostGpusPerNode)) {
        broken("an assignment names more GPUs than a node holds");
      }
      for (const int gpu : assignment.gpus) {
        if (gpu < 0 || gpu >= kMostGpusPerNode) broken("an assignment's GPU index");
      }
    } catch (const std::runtime_error&) {
    }
  }
  return 0;
}
