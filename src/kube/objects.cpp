#include "kube/objects.h"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "base/strings.h"
#include "contract/annotations.h"
#include "contract/pod_resources.h"
#include "kube/json_input.h"
#include "kube/quantity.h"

namespace tessera::kube {
namespace {

// Sums a resource over the pod's containers, from limits (the GPU resources) or requests.
// The sum is held to `most` too: a pod of many containers must not overflow it.
template <typename Parse>
std::int64_t sum_resource(const nlohmann::json& pod, const std::string& pod_name, const char* kind,
                          const std::string& resource, Parse parse, std::int64_t most) {
  std::int64_t total = 0;
  const nlohmann::json& containers =
      container_at(pod, {"spec", "containers"}, true, "pod " + pod_name, "spec.containers");
  for (const auto& container : containers) {
    const nlohmann::json& section =
        container_at(container, {"resources"}, false, "pod " + pod_name, "a container's resources");
    const nlohmann::json* source = nullptr;
    if (section.contains(kind) && section[kind].contains(resource))
      source = &section[kind][resource];
    if (source == nullptr && section.contains("limits") && section["limits"].contains(resource)) {
      source = &section["limits"][resource];
    }
    if (source == nullptr) continue;
    std::int64_t value = 0;
    if (!parse(text_of(*source), value)) {
      throw std::runtime_error(fmt::format("pod {}: {}.{}={} is not a quantity (or out of range)",
                                           pod_name, kind, resource, dump_outside_json(*source)));
    }
    total += value;
    if (total > most) {
      throw std::runtime_error(
          fmt::format("pod {}: {}.{} sums to more than {}", pod_name, kind, resource, most));
    }
  }
  return total;
}

}  // namespace

// An integer member of `object` from lo to hi; throws naming it otherwise.
std::int64_t integer_field(const nlohmann::json& object, const char* name, std::int64_t lo,
                           std::int64_t hi) {
  const auto found = object.find(name);
  if (found == object.end()) throw std::runtime_error(fmt::format("{} is missing", name));
  const bool in_range = found->is_number_unsigned()
                            ? found->get<std::uint64_t>() <= static_cast<std::uint64_t>(hi) &&
                                  static_cast<std::int64_t>(found->get<std::uint64_t>()) >= lo
                            : found->is_number_integer() && found->get<std::int64_t>() >= lo &&
                                  found->get<std::int64_t>() <= hi;
  if (!in_range) {
    throw std::runtime_error(fmt::format("{}={} is not an integer from {} to {}", name,
                                         dump_outside_json(*found), lo, hi));
  }
  return found->get<std::int64_t>();
}

// A Kubernetes object's name: present, and no longer than the API server allows.
std::string object_name(const nlohmann::json& object, const char* what) {
  const nlohmann::json* name = nullptr;
  if (object.is_object() && object.contains("metadata") && object["metadata"].is_object() &&
      object["metadata"].contains("name")) {
    name = &object["metadata"]["name"];
  }
  if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
    throw std::runtime_error(fmt::format("a {} without metadata.name", what));
  }
  if (name->get<std::string>().size() > kMostNameLength) {
    throw std::runtime_error(
        fmt::format("a {} whose metadata.name is longer than {} bytes", what, kMostNameLength));
  }
  return name->get<std::string>();
}

// The value at `path` in an object from outside, or nullptr where a step is missing or
// not an object; never throws.
const nlohmann::json* find_at(const nlohmann::json& root, std::initializer_list<const char*> path) {
  const nlohmann::json* here = &root;
  for (const char* key : path) {
    if (!here->is_object()) return nullptr;
    const auto found = here->find(key);
    if (found == here->end()) return nullptr;
    here = &*found;
  }
  return here;
}

// The object or array at `path`, an empty one where absent; throws naming `field` of `owner`
// where something else is there.
const nlohmann::json& container_at(const nlohmann::json& root,
                                   std::initializer_list<const char*> path, bool want_array,
                                   const std::string& owner, const char* field) {
  static const nlohmann::json kNoObject = nlohmann::json::object();
  static const nlohmann::json kNoArray = nlohmann::json::array();
  const nlohmann::json* found = find_at(root, path);
  if (found == nullptr || found->is_null()) return want_array ? kNoArray : kNoObject;
  if (want_array ? !found->is_array() : !found->is_object()) {
    throw std::runtime_error(
        fmt::format("{}: {} is not {}", owner, field, want_array ? "a list" : "an object"));
  }
  return *found;
}

// The string at `path`, `absent` where there is none; throws where something else is there.
std::string string_field(const nlohmann::json& root, std::initializer_list<const char*> path,
                         const std::string& absent, const std::string& owner, const char* field) {
  const nlohmann::json* found = find_at(root, path);
  if (found == nullptr || found->is_null()) return absent;
  if (!found->is_string())
    throw std::runtime_error(fmt::format("{}: {} is not a string", owner, field));
  if (found->get_ref<const std::string&>().size() > kMostNameLength) {
    throw std::runtime_error(
        fmt::format("{}: {} is longer than {} bytes", owner, field, kMostNameLength));
  }
  return found->get<std::string>();
}

bool dns_name(const std::string& name, std::size_t most, bool dots) {
  if (name.empty() || name.size() > most) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(name.front()) || !alnum(name.back())) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return alnum(c) || c == '-' || (dots && c == '.'); });
}

std::string text_of(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number()) return value.dump();
  return {};
}

PodRequest pod_from_json(const nlohmann::json& pod) {
  PodRequest request;
  request.name = object_name(pod, "pod");
  request.namespace_name = string_field(pod, {"metadata", "namespace"}, "default",
                                        "pod " + request.name, "metadata.namespace");
  request.uid = string_field(pod, {"metadata", "uid"}, "", "pod " + request.name, "metadata.uid");
  const std::string label = request.namespace_name + "/" + request.name;
  if (const nlohmann::json::json_pointer at("/spec/priority");
      pod.contains(at) && !pod[at].is_null()) {
    const nlohmann::json& priority = pod[at];
    // Kubernetes' int32, set from the pod's PriorityClass at admission. (An unsigned value past
    // 2^63 reads back negative: below the minimum, refused all the same.)
    if (!priority.is_number_integer() ||
        priority.get<std::int64_t>() < std::numeric_limits<std::int32_t>::min() ||
        priority.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
      throw std::runtime_error(fmt::format("pod {}: spec.priority={} is not a 32-bit integer",
                                           label, priority.dump().substr(0, 40)));
    }
    request.priority = static_cast<std::int32_t>(priority.get<std::int64_t>());
  }
  request.cpu_milli = sum_resource(pod, label, "requests", "cpu", parse_cpu_milli, kMostCpuMilli);
  request.memory_mib =
      sum_resource(pod, label, "requests", "memory", parse_memory_mib, kMostMemoryMib);
  using contract::PodResource;
  const auto limit = [&](PodResource resource) {
    return sum_resource(pod, label, "limits", contract::resource_name(resource), parse_count,
                        kMostCount);
  };
  request.gpus = static_cast<int>(limit(PodResource::gpus));
  request.gpumem_mib = limit(PodResource::gpu_memory_mib);
  request.gpumem_percent = static_cast<int>(limit(PodResource::gpu_memory_percent));
  request.gpucores = static_cast<int>(limit(PodResource::gpu_cores));
  const std::int64_t gpushare_gib = limit(PodResource::gpushare_memory);
  if (request.gpumem_percent > 100 || request.gpucores > 100) {
    throw std::runtime_error(fmt::format(
        "pod {}: {} and {} are percentages of one GPU (at most 100)", label,
        resource_name(PodResource::gpu_memory_percent), resource_name(PodResource::gpu_cores)));
  }
  if (gpushare_gib > 0) {
    // gpushare's pods ask for GiB of one GPU: a slice of one GPU with that memory.
    if (request.gpus > 0 || request.gpumem_mib > 0 || request.gpumem_percent > 0 ||
        request.gpucores > 0) {
      throw std::runtime_error(fmt::format(
          "pod {}: {} cannot be asked for beside {} or HAMi's "
          "GPU memory and cores",
          label, resource_name(PodResource::gpushare_memory), resource_name(PodResource::gpus)));
    }
    request.gpus = 1;
    request.gpumem_mib = gpushare_gib << 10;
  }
  for (const auto& container :
       container_at(pod, {"spec", "containers"}, true, "pod " + label, "spec.containers")) {
    PodRequest::Container entry;
    entry.name = string_field(container, {"name"}, "", "pod " + label, "a container's name");
    // Its own counts, each read as the sums above were.
    const auto own = [&](PodResource resource) -> std::int64_t {
      const nlohmann::json* value =
          find_at(container, {"resources", "limits", contract::resource_name(resource)});
      std::int64_t count = 0;
      if (value == nullptr) return -1;
      if (!parse_count(text_of(*value), count)) {
        throw std::runtime_error(fmt::format("pod {}: container {}: limits.{} is not a count",
                                             label, entry.name.substr(0, 64),
                                             contract::resource_name(resource)));
      }
      return count;
    };
    entry.gpus = static_cast<int>(std::max<std::int64_t>(own(PodResource::gpus), 0));
    entry.gpumem_mib = std::max<std::int64_t>(own(PodResource::gpu_memory_mib), 0);
    entry.gpumem_percent =
        static_cast<int>(std::max<std::int64_t>(own(PodResource::gpu_memory_percent), 0));
    entry.gpucores = static_cast<int>(std::max<std::int64_t>(own(PodResource::gpu_cores), 0));
    entry.gpushare_gib =
        static_cast<int>(std::max<std::int64_t>(own(PodResource::gpushare_memory), 0));
    entry.hami_priority = static_cast<int>(std::min<std::int64_t>(own(PodResource::priority), 1));
    request.containers.push_back(std::move(entry));
    // MIG devices by profile, as the node agent's mixed strategy serves them.
    const nlohmann::json* limits = find_at(container, {"resources", "limits"});
    if (limits == nullptr || !limits->is_object()) continue;
    for (const auto& [resource, value] : limits->items()) {
      if (!resource.starts_with(contract::kMigResourcePrefix)) continue;
      const std::string profile = resource.substr(contract::kMigResourcePrefix.size());
      std::int64_t devices = 0;
      if (profile.empty() || profile.size() > 32 || !parse_count(text_of(value), devices) ||
          devices > kMostCount) {
        throw std::runtime_error(fmt::format("pod {}: limits.{}='{}' is not a count of MIG devices",
                                             label, resource.substr(0, 64),
                                             text_of(value).substr(0, 40)));
      }
      if (request.mig.size() >= 16 && !request.mig.contains(profile)) {
        throw std::runtime_error(fmt::format("pod {}: more than 16 MIG profiles", label));
      }
      int& total = request.mig[profile];
      total = static_cast<int>(std::min<std::int64_t>(total + devices, kMostCount));
    }
  }
  const nlohmann::json& annotations =
      container_at(pod, {"metadata", "annotations"}, false, "pod " + label, "metadata.annotations");
  if (annotations.contains(contract::kUseGpuTypeAnnotation)) {
    request.use_types =
        base::split_list(text_of(annotations[contract::kUseGpuTypeAnnotation]), ',');
  }
  if (annotations.contains(contract::kNoUseGpuTypeAnnotation)) {
    request.nouse_types =
        base::split_list(text_of(annotations[contract::kNoUseGpuTypeAnnotation]), ',');
  }
  if (annotations.contains(contract::kPolicyAnnotation)) {
    request.policy = text_of(annotations[contract::kPolicyAnnotation]);
  } else if (annotations.contains(contract::kHamiPolicyAnnotation)) {
    const std::string hami = text_of(annotations[contract::kHamiPolicyAnnotation]);
    request.policy = hami == "spread" ? "spread" : "best-fit";  // HAMi's binpack
  }
  if (annotations.contains(contract::kPriorityAnnotation)) {
    const std::string priority = text_of(annotations[contract::kPriorityAnnotation]);
    if (priority != "high" && priority != "low") {
      throw std::runtime_error(fmt::format("pod {}: annotation {}='{}' must be high or low", label,
                                           contract::kPriorityAnnotation, priority.substr(0, 40)));
    }
    request.priority_annotation = priority == "high" ? Priority::high : Priority::low;
  }
  if (annotations.contains(contract::kBurstAnnotation)) {
    const std::string burst = text_of(annotations[contract::kBurstAnnotation]);
    if (burst != "true" && burst != "false") {
      throw std::runtime_error(fmt::format("pod {}: annotation {}='{}' must be true or false",
                                           label, contract::kBurstAnnotation, burst.substr(0, 40)));
    }
    request.burst = burst == "true";
  }
  return request;
}

bool pod_finished(const nlohmann::json& pod) {
  const std::string phase = string_at(pod, "/status/phase"_json_pointer);
  return phase == "Succeeded" || phase == "Failed";
}

Priority container_priority(const PodRequest& pod, const PodRequest::Container& container) {
  const Priority hami = container.hami_priority < 0    ? Priority::none
                        : container.hami_priority == 0 ? Priority::high
                                                       : Priority::low;
  if (hami == Priority::none && pod.priority_annotation == Priority::none) {
    return contract::kHamiDefaultPriority == 0 ? Priority::high : Priority::low;
  }
  return lower_priority(hami, pod.priority_annotation);
}

RecordedAssignment assignment_from_annotation(const nlohmann::json& text) {
  if (!text.is_string()) throw std::runtime_error("it is not a string");
  const nlohmann::json record = parse_outside_json(text.get<std::string>());
  if (!record.is_object()) throw std::runtime_error("it is not a JSON object");
  RecordedAssignment assignment;
  const auto node = record.find("node");
  if (node == record.end() || !node->is_string() || node->get<std::string>().empty() ||
      node->get<std::string>().size() > kMostNameLength) {
    throw std::runtime_error("node must name a node");
  }
  assignment.node = node->get<std::string>();
  const auto gpus = record.find("gpus");
  if (gpus == record.end() || !gpus->is_array() || gpus->size() > kMostGpusPerNode) {
    throw std::runtime_error(
        fmt::format("gpus must be a list of at most {} GPU indices", kMostGpusPerNode));
  }
  bool taken[kMostGpusPerNode] = {};
  for (const nlohmann::json& gpu : *gpus) {
    if (!gpu.is_number_integer() || gpu.get<std::int64_t>() < 0 ||
        gpu.get<std::int64_t>() >= kMostGpusPerNode) {
      throw std::runtime_error(fmt::format("gpus holds {}, not an index from 0 to {}",
                                           dump_outside_json(gpu), kMostGpusPerNode - 1));
    }
    const int index = gpu.get<int>();
    if (taken[index]) throw std::runtime_error(fmt::format("gpus names GPU {} twice", index));
    taken[index] = true;
    assignment.gpus.push_back(index);
  }
  if (const auto uuids = record.find("uuids"); uuids != record.end()) {
    if (!uuids->is_array() || uuids->size() != assignment.gpus.size()) {
      throw std::runtime_error("uuids must list one GPU UUID for each of gpus");
    }
    for (const nlohmann::json& uuid : *uuids) {
      if (!uuid.is_string() || uuid.get_ref<const std::string&>().empty() ||
          uuid.get_ref<const std::string&>().size() > 96) {
        throw std::runtime_error(
            fmt::format("uuids holds {}, not a GPU UUID", dump_outside_json(uuid)));
      }
      assignment.uuids.push_back(uuid.get<std::string>());
    }
  }
  if (record.contains("milli")) {
    assignment.milli = static_cast<int>(integer_field(record, "milli", 0, 1000));
  }
  return assignment;
}

std::string assignment_annotation(const RecordedAssignment& assignment) {
  nlohmann::json record{
      {"node", assignment.node}, {"gpus", assignment.gpus}, {"milli", assignment.milli}};
  if (!assignment.uuids.empty()) record["uuids"] = assignment.uuids;
  return dump_outside_json(record);
}

}  // namespace tessera::kube
