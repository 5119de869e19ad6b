#include "extender/cluster_objects.h"

#include <fmt/core.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "contract/gpu_numbering.h"
#include "kube/json_input.h"
#include "kube/quantity.h"

namespace tessera::extender {

using kube::container_at;
using kube::dump_outside_json;
using kube::integer_field;
using kube::kMostCount;
using kube::object_name;
using kube::parse_cpu_milli;
using kube::parse_memory_mib;
using kube::parse_outside_json;
using kube::text_of;

namespace {

std::string model_of(const nlohmann::json& object) {
  const auto model = object.find("model");
  if (model == object.end() || !model->is_string() || model->get<std::string>().empty() ||
      model->get<std::string>().size() > kMostNameLength) {
    throw std::runtime_error("model must name the GPU model");
  }
  return model->get<std::string>();
}

// A MIG GPU's index and catalog model (mig_model), or nullopt where an older agent gave none.
std::optional<MigGpuLayout> mig_gpu_of(const nlohmann::json& gpu) {
  const auto model = gpu.find("mig_model");
  const auto index = gpu.find("index");
  if (model == gpu.end() || !model->is_string() || model->get_ref<const std::string&>().empty() ||
      model->get_ref<const std::string&>().size() > kMostNameLength || index == gpu.end() ||
      !index->is_number_integer() || index->get<std::int64_t>() < 0 ||
      index->get<std::int64_t>() >= 64) {
    return std::nullopt;
  }
  MigGpuLayout layout;
  layout.index = index->get<int>();
  layout.model = model->get<std::string>();
  return layout;
}

// A MIG device's placement (start, 0 to 7) and whether it is held; without both, the GPU's
// layout is not known well enough to plan from and is dropped.
void read_placement(const nlohmann::json& profile, const nlohmann::json& device,
                    std::optional<MigGpuLayout>& layout) {
  if (!layout) return;
  const auto start = device.find("start");
  const auto held = device.find("held");
  if (start == device.end() || !start->is_number_integer() || start->get<std::int64_t>() < 0 ||
      start->get<std::int64_t>() > 7 || held == device.end() || !held->is_boolean()) {
    layout.reset();
    return;
  }
  layout->instances.push_back({profile.get<std::string>(), start->get<int>(), held->get<bool>()});
}

// The node agent's format: each GPU with its UUID, model, memory and how it is shared. The
// engine places on GPUs served whole (whole-GPU pods only) or cut into slices; time-sliced,
// MPS and MIG GPUs are the kubelet's to count, device by device, and are left out.
void gpus_from_list(const nlohmann::json& annotation, NodeInfo& info) {
  const auto list = annotation.find("gpus");
  if (!list->is_array() || list->size() > 64) throw std::runtime_error("gpus must be a list");
  for (const nlohmann::json& gpu : *list) {
    if (!gpu.is_object()) throw std::runtime_error("gpus holds something other than an object");
    const auto sharing = gpu.find("sharing");
    if (sharing == gpu.end() || !sharing->is_string()) {
      throw std::runtime_error("a GPU without sharing (none, slices, timeslice, mps or mig)");
    }
    const std::string& mode = sharing->get_ref<const std::string&>();
    // MIG devices are the kubelet's to hand out, by profile; the engine counts them, each as
    // its share of the GPU's memory (as a sharing pod's gpumem is counted).
    if (mode == contract::kSharingMig) {
      const auto devices = gpu.find("mig_devices");
      if (devices == gpu.end() || !devices->is_array() || devices->size() > 8) {
        throw std::runtime_error("a MIG GPU's mig_devices must be a list of at most 8");
      }
      // For re-cut plans: where each instance sits and whether it is held, when all say so.
      std::optional<MigGpuLayout> layout = mig_gpu_of(gpu);
      std::int64_t gpu_memory = 0;
      try {  // its devices are weighed by their share of it
        gpu_memory = integer_field(gpu, "memory_mib", 1, kMostCount);
      } catch (const std::runtime_error& error) {
        throw std::runtime_error(fmt::format("a MIG GPU's {}", error.what()));
      }
      for (const nlohmann::json& device : *devices) {
        const auto profile = device.is_object() ? device.find("profile") : device.end();
        if (profile == device.end() || !profile->is_string() ||
            profile->get_ref<const std::string&>().empty() ||
            profile->get_ref<const std::string&>().size() > 32) {
          throw std::runtime_error("a MIG device without a profile");
        }
        std::string name = profile->get<std::string>();  // "1g.10gb+me" -> "1g.10gb.me"
        std::int64_t memory = 0;
        try {  // a device is weighed by its share of the GPU's memory
          memory = integer_field(device, "memory_mib", 1, gpu_memory);
        } catch (const std::runtime_error& error) {
          throw std::runtime_error(fmt::format("MIG device {}: {}", name, error.what()));
        }
        read_placement(*profile, device, layout);
        std::replace(name.begin(), name.end(), '+', '.');
        auto same =
            std::find_if(info.spec.mig.begin(), info.spec.mig.end(),
                         [&](const sched::MigDevices& have) { return have.profile == name; });
        if (same == info.spec.mig.end()) {
          if (info.spec.mig.size() >= sched::kMostMigProfilesPerNode) {
            throw std::runtime_error(
                fmt::format("more than {} MIG profiles", sched::kMostMigProfilesPerNode));
          }
          const auto share = (memory * kMilli + gpu_memory / 2) / gpu_memory;
          info.spec.mig.push_back({name, 0, static_cast<int>(std::max<std::int64_t>(share, 1))});
          same = info.spec.mig.end() - 1;
        }
        ++same->count;
      }
      if (layout) info.mig_gpus.push_back(std::move(*layout));
      continue;
    }
    if (mode == contract::kSharingTimeSlicing || mode == contract::kSharingMps) {
      ++info.kubelet_counted_gpus;
      continue;
    }
    if (!contract::scheduler_numbers(mode)) {
      throw std::runtime_error(fmt::format(
          "sharing '{}' is not none, slices, timeslice, mps or mig", mode.substr(0, 40)));
    }
    if (info.spec.gpus == kMostGpusPerNode) {
      throw std::runtime_error(fmt::format("more than {} GPUs", kMostGpusPerNode));
    }
    const std::string model = model_of(gpu);
    // A node's GPUs are described by the first one's model (the engine holds one a node).
    if (info.spec.model.empty()) info.spec.model = model;
    const std::int64_t memory = integer_field(gpu, "memory_mib", 1, kMostCount);
    info.gpu_memory_mib = info.gpu_memory_mib == 0 ? memory : std::min(info.gpu_memory_mib, memory);
    const auto uuid = gpu.find("uuid");
    if (uuid == gpu.end() || !uuid->is_string() || uuid->get_ref<const std::string&>().empty() ||
        uuid->get_ref<const std::string&>().size() > 96) {
      throw std::runtime_error("a GPU without a uuid");
    }
    info.gpu_uuids.push_back(uuid->get<std::string>());
    if (mode == contract::kSharingNone)
      info.spec.whole_only_gpus |= static_cast<std::uint16_t>(1u << info.spec.gpus);
    ++info.spec.gpus;
  }
}

}  // namespace

NodeInfo node_from_json(const nlohmann::json& node) {
  NodeInfo info;
  info.spec.name = object_name(node, "node");
  const nlohmann::json& allocatable = container_at(node, {"status", "allocatable"}, false,
                                                   "node " + info.spec.name, "status.allocatable");
  const std::string cpu = text_of(allocatable.value("cpu", nlohmann::json()));
  const std::string memory = text_of(allocatable.value("memory", nlohmann::json()));
  if (!parse_cpu_milli(cpu, info.spec.cpu_milli)) {
    throw std::runtime_error(
        fmt::format("node {}: status.allocatable.cpu='{}' is not a quantity (or out of range)",
                    info.spec.name, cpu));
  }
  if (!parse_memory_mib(memory, info.spec.memory_mib)) {
    throw std::runtime_error(
        fmt::format("node {}: status.allocatable.memory='{}' is not a quantity (or out of range)",
                    info.spec.name, memory));
  }
  const nlohmann::json& annotations = container_at(
      node, {"metadata", "annotations"}, false, "node " + info.spec.name, "metadata.annotations");
  if (!annotations.contains(kGpusAnnotation)) return info;  // no GPUs Tessera knows of
  try {
    const nlohmann::json& text = annotations[kGpusAnnotation];
    if (!text.is_string()) throw std::runtime_error("not a string");
    const nlohmann::json gpus = parse_outside_json(text.get<std::string>());
    if (!gpus.is_object()) throw std::runtime_error("not an object");
    if (gpus.contains("gpus")) {
      gpus_from_list(gpus, info);
    } else {  // the first format: every GPU alike
      info.spec.model = model_of(gpus);
      info.spec.gpus = static_cast<int>(integer_field(gpus, "count", 0, kMostGpusPerNode));
      info.gpu_memory_mib = integer_field(gpus, "memory_mib", 1, kMostCount);
    }
  } catch (const std::exception& error) {
    throw std::runtime_error(fmt::format(
        "node {}: annotation {} is neither {{\"gpus\": [...]}} nor {{\"model\", \"count\", "
        "\"memory_mib\"}}: {}",
        info.spec.name, kGpusAnnotation, error.what()));
  }
  return info;
}

bool kubelet_counts(const NodeInfo& node, const PodRequest& pod) {
  return pod.gpus > 0 && pod.gpumem_mib == 0 && pod.gpumem_percent == 0 && pod.gpucores == 0 &&
         node.spec.gpus == 0 && node.kubelet_counted_gpus > 0;
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
  for (const auto& [profile, count] : pod.mig) spec.mig.emplace_back(profile, count);
  return cluster.request_for(spec);
}

std::string model_refusal(const PodRequest& pod, const std::string& model) {
  auto named = [&](const std::vector<std::string>& list) {
    return std::any_of(list.begin(), list.end(), [&](const std::string& item) {
      return model.find(item) != std::string::npos;
    });
  };
  if (!pod.use_types.empty() && !named(pod.use_types)) {
    return fmt::format("GPU model {} is not in {}", model, contract::kUseGpuTypeAnnotation);
  }
  if (!pod.nouse_types.empty() && named(pod.nouse_types)) {
    return fmt::format("GPU model {} is in {}", model, contract::kNoUseGpuTypeAnnotation);
  }
  return {};
}

}  // namespace tessera::extender
