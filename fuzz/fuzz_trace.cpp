// Cluster traces (node and pod CSVs in the openb format): read into checked specs, or refused
// with a std::runtime_error naming the line and column.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "fuzz_input.h"
#include "sched/trace.h"

using namespace tessera::sched;
using tessera::fuzz::broken;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const tessera::fuzz::InputFile file(data + 1, size - 1);
  try {
    if (data[0] & 1) {
      for (const PodSpec& pod : read_pods(file.path())) {
        if (pod.gpus < 0 || pod.gpus > kMostGpusPerNode || pod.gpu_milli < 0 ||
            pod.gpu_milli > kMilli || pod.cpu_milli < 0 || pod.memory_mib < 0) {
          broken("a pod out of range was read");
        }
      }
    } else {
      for (const NodeSpec& node : read_nodes(file.path())) {
        if (node.gpus < 0 || node.gpus > kMostGpusPerNode || node.cpu_milli < 0 ||
            node.memory_mib < 0 || (node.gpus > 0 && node.model.empty())) {
          broken("a node out of range was read");
        }
      }
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
