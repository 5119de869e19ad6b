// Kubernetes objects read from outside, with bounds and type checks: names and fields, a
// pod's GPU request in NVIDIA's, HAMi's and gpushare's resource names (contract/pod_resources.h),
// and Tessera's record of where the scheduler placed a pod (tessera.io/assignment), which the
// extender writes and the node agent reads. Every refusal is a std::runtime_error naming the
// object and the field.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/priority.h"
#include "contract/annotations.h"

namespace tessera::kube {

inline constexpr std::size_t kMostNameLength = 253;  // a DNS subdomain, as Kubernetes allows
inline constexpr int kMostGpusPerNode = 16;

struct PodRequest {
  std::string uid, name, namespace_name;
  std::int64_t cpu_milli = 0, memory_mib = 0;
  // nvidia.com/gpu; a gpushare pod (aliyun.com/gpu-mem) asks for 1, with gpumem_mib its GiB.
  int gpus = 0;
  std::int64_t gpumem_mib = 0;                      // nvidia.com/gpumem, per GPU
  int gpumem_percent = 0;                           // nvidia.com/gpumem-percentage
  int gpucores = 0;                                 // nvidia.com/gpucores, percent of a GPU
  std::vector<std::string> use_types, nouse_types;  // nvidia.com/use-gputype, nouse-gputype
  std::string policy;  // tessera.io/policy or HAMi's gpu-scheduler-policy
  Priority priority_annotation = Priority::none;  // tessera.io/priority
  bool burst = false;                             // tessera.io/burst
  std::int32_t priority = 0;  // spec.priority (from its PriorityClass): who preempts whom
  struct Container {
    std::string name;
    // Its own limits (the pod's above are sums over its containers).
    int gpus = 0;                 // nvidia.com/gpu
    std::int64_t gpumem_mib = 0;  // nvidia.com/gpumem
    int gpumem_percent = 0;       // nvidia.com/gpumem-percentage
    int gpucores = 0;             // nvidia.com/gpucores
    int gpushare_gib = 0;         // aliyun.com/gpu-mem
    int hami_priority = -1;       // nvidia.com/priority; -1 where it has none
  };
  std::vector<Container> containers;  // in the pod's order
  // nvidia.com/mig-<profile> limits, summed over containers, by profile ("1g.10gb.me").
  std::map<std::string, int> mig;
};

// Throws std::runtime_error naming the pod and the field at fault.
PodRequest pod_from_json(const nlohmann::json& pod);

// Whether a pod has run to its end (phase Succeeded or Failed): its devices are free again.
bool pod_finished(const nlohmann::json& pod);

// A container's priority on its GPUs: the lower of its nvidia.com/priority (0 high, else low)
// and the pod's tessera.io/priority; HAMi's default (low) where neither is given.
Priority container_priority(const PodRequest& pod, const PodRequest::Container& container);

// A pod's tessera.io/assignment annotation: the node, the GPUs there (the scheduler's
// numbering, and their UUIDs where the node said them) and the share of each.
struct RecordedAssignment {
  std::string node;
  std::vector<int> gpus;           // distinct, each below kMostGpusPerNode
  std::vector<std::string> uuids;  // empty, or one per GPU
  int milli = 0;                   // per GPU; 0 where not recorded
};
// Throws std::runtime_error saying what is wrong with it.
RecordedAssignment assignment_from_annotation(const nlohmann::json& text);
// The annotation's value for an assignment.
std::string assignment_annotation(const RecordedAssignment& assignment);

// --- reading fields of objects from outside ---------------------------------------------

// An integer member of `object` from lo to hi; throws naming it otherwise.
std::int64_t integer_field(const nlohmann::json& object, const char* name, std::int64_t lo,
                           std::int64_t hi);
// A Kubernetes object's name: present, and no longer than the API server allows.
std::string object_name(const nlohmann::json& object, const char* what);
// The value at `path` in an object from outside, or nullptr where a step is missing or
// not an object; never throws.
const nlohmann::json* find_at(const nlohmann::json& root, std::initializer_list<const char*> path);
// The object or array at `path`, an empty one where absent; throws naming `field` of `owner`
// where something else is there.
const nlohmann::json& container_at(const nlohmann::json& root,
                                   std::initializer_list<const char*> path, bool want_array,
                                   const std::string& owner, const char* field);
// The string at `path`, `absent` where there is none; throws where something else is there.
std::string string_field(const nlohmann::json& root, std::initializer_list<const char*> path,
                         const std::string& absent, const std::string& owner, const char* field);
// Whether `name` follows Kubernetes' rules for names that go into API paths: a DNS label
// (`dots` false: a namespace) or subdomain (a pod, a node), at most `most` bytes.
bool dns_name(const std::string& name, std::size_t most, bool dots);
// A string or a number as text; "" for anything else.
std::string text_of(const nlohmann::json& value);

}  // namespace tessera::kube
