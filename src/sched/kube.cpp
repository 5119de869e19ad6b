#include "sched/kube.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace tessera::sched::kube {
namespace {

bool parse_number(std::string_view text, double& value) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() && value >= 0;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

std::string text_of(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number()) return value.dump();
  return {};
}

// Sums a resource over the pod's containers, from limits (the GPU resources) or requests.
template <typename Parse>
std::int64_t sum_resource(const nlohmann::json& pod, const std::string& pod_name, const char* kind,
                          const std::string& resource, Parse parse) {
  std::int64_t total = 0;
  const auto containers = pod.value("/spec/containers"_json_pointer, nlohmann::json::array());
  for (const auto& container : containers) {
    const auto section = container.value("/resources"_json_pointer, nlohmann::json::object());
    const nlohmann::json* source = nullptr;
    if (section.contains(kind) && section[kind].contains(resource))
      source = &section[kind][resource];
    if (source == nullptr && section.contains("limits") && section["limits"].contains(resource)) {
      source = &section["limits"][resource];
    }
    if (source == nullptr) continue;
    std::int64_t value = 0;
    if (!parse(text_of(*source), value)) {
      throw std::runtime_error(fmt::format("pod {}: {}.{}={} is not a quantity", pod_name, kind,
                                           resource, source->dump()));
    }
    total += value;
  }
  return total;
}

bool parse_count(std::string_view text, std::int64_t& value) {
  double number = 0;
  if (!parse_number(text, number) ||
      number != static_cast<double>(static_cast<std::int64_t>(number))) {
    return false;
  }
  value = static_cast<std::int64_t>(number);
  return true;
}

}  // namespace

bool parse_cpu_milli(std::string_view text, std::int64_t& milli) {
  double value = 0;
  if (!text.empty() && text.back() == 'm') {
    if (!parse_number(text.substr(0, text.size() - 1), value)) return false;
    milli = static_cast<std::int64_t>(value);
    return true;
  }
  if (!parse_number(text, value)) return false;
  milli = static_cast<std::int64_t>(value * 1000);
  return true;
}

bool parse_memory_mib(std::string_view text, std::int64_t& mib) {
  static const std::pair<const char*, double> kSuffixes[] = {
      {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
      {"k", 1e3},     {"M", 1e6},        {"G", 1e9},           {"T", 1e12}};
  double multiplier = 1;
  std::string_view number = text;
  for (const auto& [suffix, factor] : kSuffixes) {
    const std::string_view s(suffix);
    if (text.size() > s.size() && text.substr(text.size() - s.size()) == s) {
      number = text.substr(0, text.size() - s.size());
      multiplier = factor;
      break;
    }
  }
  double value = 0;
  if (!parse_number(number, value)) return false;
  const double bytes = value * multiplier;
  mib = static_cast<std::int64_t>((bytes + 1048575.0) / 1048576.0);
  return true;
}

NodeInfo node_from_json(const nlohmann::json& node) {
  NodeInfo info;
  info.spec.name = node.value("/metadata/name"_json_pointer, std::string());
  if (info.spec.name.empty()) throw std::runtime_error("a node without metadata.name");
  const auto allocatable = node.value("/status/allocatable"_json_pointer, nlohmann::json::object());
  const std::string cpu = text_of(allocatable.value("cpu", nlohmann::json()));
  const std::string memory = text_of(allocatable.value("memory", nlohmann::json()));
  if (!parse_cpu_milli(cpu, info.spec.cpu_milli)) {
    throw std::runtime_error(
        fmt::format("node {}: status.allocatable.cpu='{}' is not a quantity", info.spec.name, cpu));
  }
  if (!parse_memory_mib(memory, info.spec.memory_mib)) {
    throw std::runtime_error(fmt::format(
        "node {}: status.allocatable.memory='{}' is not a quantity", info.spec.name, memory));
  }
  const auto annotations =
      node.value("/metadata/annotations"_json_pointer, nlohmann::json::object());
  if (!annotations.contains(kGpusAnnotation)) return info;  // no GPUs Tessera knows of
  nlohmann::json gpus;
  try {
    gpus = nlohmann::json::parse(annotations[kGpusAnnotation].get<std::string>());
    info.spec.model = gpus.at("model").get<std::string>();
    info.spec.gpus = gpus.at("count").get<int>();
    info.gpu_memory_mib = gpus.at("memory_mib").get<std::int64_t>();
  } catch (const std::exception& error) {
    throw std::runtime_error(
        fmt::format("node {}: annotation {} is not {{\"model\", \"count\", \"memory_mib\"}}: {}",
                    info.spec.name, kGpusAnnotation, error.what()));
  }
  if (info.spec.gpus < 0 || info.spec.gpus > kMaxGpusPerNode || info.gpu_memory_mib <= 0 ||
      info.spec.model.empty()) {
    throw std::runtime_error(
        fmt::format("node {}: annotation {}: count must be 0 to {}, memory_mib "
                    "above 0, model named",
                    info.spec.name, kGpusAnnotation, kMaxGpusPerNode));
  }
  return info;
}

PodRequest pod_from_json(const nlohmann::json& pod) {
  PodRequest request;
  request.name = pod.value("/metadata/name"_json_pointer, std::string());
  request.namespace_name = pod.value("/metadata/namespace"_json_pointer, std::string("default"));
  request.uid = pod.value("/metadata/uid"_json_pointer, std::string());
  if (request.name.empty()) throw std::runtime_error("a pod without metadata.name");
  const std::string label = request.namespace_name + "/" + request.name;
  request.cpu_milli = sum_resource(pod, label, "requests", "cpu", parse_cpu_milli);
  request.memory_mib = sum_resource(pod, label, "requests", "memory", parse_memory_mib);
  request.gpus =
      static_cast<int>(sum_resource(pod, label, "limits", "nvidia.com/gpu", parse_count));
  request.gpumem_mib = sum_resource(pod, label, "limits", "nvidia.com/gpumem", parse_count);
  request.gpumem_percent = static_cast<int>(
      sum_resource(pod, label, "limits", "nvidia.com/gpumem-percentage", parse_count));
  request.gpucores =
      static_cast<int>(sum_resource(pod, label, "limits", "nvidia.com/gpucores", parse_count));
  if (request.gpumem_percent > 100 || request.gpucores > 100) {
    throw std::runtime_error(
        fmt::format("pod {}: nvidia.com/gpumem-percentage and nvidia.com/gpucores "
                    "are percentages of one GPU (at most 100)",
                    label));
  }
  const auto annotations =
      pod.value("/metadata/annotations"_json_pointer, nlohmann::json::object());
  if (annotations.contains("nvidia.com/use-gputype")) {
    request.use_types = split_list(text_of(annotations["nvidia.com/use-gputype"]));
  }
  if (annotations.contains("nvidia.com/nouse-gputype")) {
    request.nouse_types = split_list(text_of(annotations["nvidia.com/nouse-gputype"]));
  }
  if (annotations.contains(kPolicyAnnotation)) {
    request.policy = text_of(annotations[kPolicyAnnotation]);
  } else if (annotations.contains("hami.io/gpu-scheduler-policy")) {
    const std::string hami = text_of(annotations["hami.io/gpu-scheduler-policy"]);
    request.policy = hami == "spread" ? "spread" : "best-fit";  // HAMi's binpack
  }
  return request;
}

Request request_on(const Cluster& cluster, const PodRequest& pod, std::int64_t gpu_memory_mib) {
  PodSpec spec;
  spec.name = pod.name;
  spec.cpu_milli = pod.cpu_milli;
  spec.memory_mib = pod.memory_mib;
  spec.gpus = pod.gpus;
  int milli = pod.gpus > 0 ? kMilli : 0;
  if (pod.gpus > 0 && (pod.gpumem_mib > 0 || pod.gpumem_percent > 0 || pod.gpucores > 0)) {
    std::int64_t share = std::max<std::int64_t>(pod.gpumem_percent, pod.gpucores) * 10;
    if (pod.gpumem_mib > 0 && gpu_memory_mib > 0) {
      share = std::max(share, (pod.gpumem_mib * kMilli + gpu_memory_mib - 1) / gpu_memory_mib);
    }
    // More than a GPU here holds cannot fit: kMilli + 1 fits no GPU.
    milli = static_cast<int>(std::clamp<std::int64_t>(share, 1, kMilli + 1));
  }
  spec.gpu_milli = pod.gpus > 1 ? std::max(milli, kMilli) : milli;  // several GPUs are whole GPUs
  return cluster.request_for(spec);
}

std::string model_refusal(const PodRequest& pod, const std::string& model) {
  auto named = [&](const std::vector<std::string>& list) {
    return std::any_of(list.begin(), list.end(), [&](const std::string& item) {
      return model.find(item) != std::string::npos;
    });
  };
  if (!pod.use_types.empty() && !named(pod.use_types)) {
    return fmt::format("GPU model {} is not in nvidia.com/use-gputype", model);
  }
  if (!pod.nouse_types.empty() && named(pod.nouse_types)) {
    return fmt::format("GPU model {} is in nvidia.com/nouse-gputype", model);
  }
  return {};
}

}  // namespace tessera::sched::kube
