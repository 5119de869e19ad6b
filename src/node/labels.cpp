#include "node/labels.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <stdexcept>

#include "base/files.h"
#include "mig/catalog.h"

namespace tessera::node {
namespace {

// The sharing mode of one GPU as the resource map serves it.
const char* gpu_sharing(const ResourceMap& map, int gpu, SharingStrategy strategy, int& slices) {
  slices = 1;
  for (const Resource& resource : map.resources) {
    for (const AdvertisedDevice& device : resource.devices) {
      if (device.gpu == gpu && device.mig >= 0) return "mig";  // served as its MIG devices
    }
  }
  for (const Resource& resource : map.resources) {
    for (const AdvertisedDevice& device : resource.devices) {
      // gpushare's memory units ride on GPUs sliced under another resource.
      if (device.gpu != gpu || device.replica < 0 || resource.kind == ResourceKind::gpushare)
        continue;
      slices = resource.replicas;
      if (resource.kind == ResourceKind::slices) return sharing_label(SharingStrategy::slices);
      return sharing_label(strategy);
    }
  }
  return "none";
}

// GFD's MIG labels: with `single`, the node's GPUs are its MIG devices (product
// <model>-MIG-<profile>, their count and memory); with `mixed`, a count, memory and SMs per
// MIG profile. Either way the node's GPUs are shared by MIG.
void add_mig_labels(const Inventory& inventory, const PluginConfig& config, Labels& labels) {
  std::map<std::string, std::vector<const MigDeviceInfo*>> by_profile;
  for (const GpuInfo& gpu : inventory.gpus) {
    for (const MigDeviceInfo& device : gpu.mig_devices)
      by_profile[device.profile].push_back(&device);
  }
  if (by_profile.empty() || config.flags.mig_strategy == MigStrategy::none) return;
  if (config.strategy() == SharingStrategy::none) labels["nvidia.com/gpu.sharing"] = "mig";
  if (config.flags.mig_strategy == MigStrategy::single) {
    const MigDeviceInfo& first = *by_profile.begin()->second.front();
    labels["nvidia.com/gpu.product"] =
        label_value(product_name(inventory.gpus.front().name) + "-MIG-" +
                    mig::resource_profile_name(first.profile));
    labels["nvidia.com/gpu.count"] = std::to_string(by_profile.begin()->second.size());
    labels["nvidia.com/gpu.memory"] = std::to_string(first.memory_bytes >> 20);
    if (first.sm_count > 0)
      labels["nvidia.com/gpu.multiprocessors"] = std::to_string(first.sm_count);
    return;
  }
  for (const auto& [profile, devices] : by_profile) {
    const std::string prefix = "nvidia.com/mig-" + mig::resource_profile_name(profile);
    labels[prefix + ".count"] = std::to_string(devices.size());
    labels[prefix + ".memory"] = std::to_string(devices.front()->memory_bytes >> 20);
    if (devices.front()->sm_count > 0) {
      labels[prefix + ".multiprocessors"] = std::to_string(devices.front()->sm_count);
    }
  }
}

}  // namespace

std::string label_value(const std::string& text) {
  std::string value;
  for (const char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') value += c;
  }
  if (value.size() > 63) value.resize(63);
  while (!value.empty() && !std::isalnum(static_cast<unsigned char>(value.back())))
    value.pop_back();
  while (!value.empty() && !std::isalnum(static_cast<unsigned char>(value.front())))
    value.erase(0, 1);
  return value;
}

std::string product_name(const std::string& model) {
  std::string kept;
  for (const char c : model) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
        c == ' ') {
      kept += c;
    }
  }
  // Runs of blanks become one '-', as strings.Fields does.
  std::string product;
  bool blank = false;
  for (const char c : kept) {
    if (c == ' ') {
      blank = !product.empty();
      continue;
    }
    if (blank) product += '-';
    blank = false;
    product += c;
  }
  return product;
}

std::string gpu_family(int major, int minor) {
  switch (major) {
    case 1:
      return "tesla";
    case 2:
      return "fermi";
    case 3:
      return "kepler";
    case 5:
      return "maxwell";
    case 6:
      return "pascal";
    case 7:
      return minor < 5 ? "volta" : "turing";
    case 8:
      return minor < 9 ? "ampere" : "ada-lovelace";
    case 9:
      return "hopper";
    case 10:
    case 12:
      return "blackwell";
    default:
      return "undefined";
  }
}

Labels gpu_labels(const Inventory& inventory, const PluginConfig& config, std::time_t now) {
  Labels labels;
  const SharingStrategy strategy = config.strategy();
  labels["nvidia.com/gpu.sharing"] = inventory.gpus.empty() ? "none" : sharing_label(strategy);
  labels["nvidia.com/mig.strategy"] = mig_strategy_name(config.flags.mig_strategy);
  labels["nvidia.com/mps.capable"] = strategy == SharingStrategy::mps ? "true" : "false";
  const bool mig_capable = std::any_of(inventory.gpus.begin(), inventory.gpus.end(),
                                       [](const GpuInfo& gpu) { return gpu.mig_capable; });
  labels["nvidia.com/mig.capable"] = mig_capable ? "true" : "false";
  if (inventory.gpus.empty()) return labels;

  // Driver X.Y[.Z] and the CUDA version it supports, in GFD's old and new spellings.
  std::vector<std::string> parts;
  for (std::size_t start = 0; start <= inventory.driver_version.size();) {
    const std::size_t dot =
        std::min(inventory.driver_version.find('.', start), inventory.driver_version.size());
    parts.push_back(label_value(inventory.driver_version.substr(start, dot - start)));
    start = dot + 1;
  }
  parts.resize(3);
  labels["nvidia.com/cuda.driver.major"] = parts[0];
  labels["nvidia.com/cuda.driver.minor"] = parts[1];
  labels["nvidia.com/cuda.driver.rev"] = parts[2];
  labels["nvidia.com/cuda.driver-version.major"] = parts[0];
  labels["nvidia.com/cuda.driver-version.minor"] = parts[1];
  labels["nvidia.com/cuda.driver-version.revision"] = parts[2];
  labels["nvidia.com/cuda.driver-version.full"] = label_value(inventory.driver_version);
  labels["nvidia.com/cuda.runtime.major"] = std::to_string(inventory.cuda_major);
  labels["nvidia.com/cuda.runtime.minor"] = std::to_string(inventory.cuda_minor);
  labels["nvidia.com/cuda.runtime-version.major"] = std::to_string(inventory.cuda_major);
  labels["nvidia.com/cuda.runtime-version.minor"] = std::to_string(inventory.cuda_minor);
  labels["nvidia.com/cuda.runtime-version.full"] =
      fmt::format("{}.{}", inventory.cuda_major, inventory.cuda_minor);

  // The GPU labels describe the node's first GPU, as GFD's do on a node of one model.
  const GpuInfo& gpu = inventory.gpus.front();
  const SharedResources& shared =
      strategy == SharingStrategy::slices ? config.slices : config.replicated();
  const SharedResource* replicated = nullptr;
  for (const SharedResource& resource : shared.resources) {
    if (resource.name == "nvidia.com/gpu") replicated = &resource;
  }
  const bool is_shared =
      replicated != nullptr && (replicated->replicas > 1 || strategy == SharingStrategy::slices);
  const bool renamed =
      replicated != nullptr && (!replicated->rename.empty() || shared.rename_by_default);
  std::string product = product_name(gpu.name);
  if (is_shared && !renamed) product += "-SHARED";
  labels["nvidia.com/gpu.product"] = label_value(product);
  labels["nvidia.com/gpu.count"] = std::to_string(inventory.gpus.size());
  labels["nvidia.com/gpu.replicas"] =
      std::to_string(replicated != nullptr ? replicated->replicas : 1);
  labels["nvidia.com/gpu.sharing-strategy"] = is_shared ? sharing_strategy_name(strategy) : "none";
  labels["nvidia.com/gpu.memory"] = std::to_string(gpu.memory_bytes >> 20);
  if (gpu.cc_major > 0) {
    labels["nvidia.com/gpu.family"] = gpu_family(gpu.cc_major, gpu.cc_minor);
    labels["nvidia.com/gpu.compute.major"] = std::to_string(gpu.cc_major);
    labels["nvidia.com/gpu.compute.minor"] = std::to_string(gpu.cc_minor);
  }
  add_mig_labels(inventory, config, labels);
  if (!config.flags.gfd_no_timestamp) labels["nvidia.com/gfd.timestamp"] = std::to_string(now);
  return labels;
}

void write_features_file(const std::string& directory, const Labels& labels) {
  std::string text = "# Written by tessera node; node-feature-discovery's local source reads it.\n";
  for (const auto& [key, value] : labels) text += key + "=" + value + "\n";
  const base::Status written =
      base::write_file_atomically(directory + "/" + kFeaturesFileName, text);
  if (!written.ok()) throw std::runtime_error(written.message());
}

nlohmann::json gpus_annotation(const Inventory& inventory, const ResourceMap& map,
                               const HealthBoard& health, SharingStrategy strategy,
                               const HeldInstances* held) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const GpuInfo& gpu : inventory.gpus) {
    int slices = 1;
    const int index = static_cast<int>(gpu.index);
    const char* sharing = gpu_sharing(map, index, strategy, slices);
    bool served = std::string(sharing) != "none";
    for (const Resource& resource : map.resources) {
      for (const AdvertisedDevice& device : resource.devices)
        served = served || device.gpu == index;
    }
    if (!served) continue;  // not advertised (MIG enabled without devices)
    nlohmann::json entry{{"index", gpu.index},
                         {"uuid", gpu.uuid},
                         {"model", product_name(gpu.name)},
                         {"memory_mib", gpu.memory_bytes >> 20},
                         {"sharing", sharing},
                         {"slices", slices},
                         {"healthy", health.healthy(index)}};
    if (std::string(sharing) == "mig") {
      nlohmann::json devices = nlohmann::json::array();
      for (const MigDeviceInfo& device : gpu.mig_devices) {
        nlohmann::json listed{{"uuid", device.uuid},
                              {"profile", device.profile},
                              {"memory_mib", device.memory_bytes >> 20}};
        if (device.start >= 0) listed["start"] = device.start;
        if (held != nullptr) listed["held"] = held->contains({gpu.index, device.gpu_instance});
        devices.push_back(listed);
      }
      entry["mig_devices"] = devices;
      // The placement rules' model, by the catalog's key: what the scheduler plans with.
      if (const mig::GpuModel* model = mig::find_model(gpu.name)) entry["mig_model"] = model->key;
    }
    gpus.push_back(entry);
  }
  return nlohmann::json{{"version", 2}, {"gpus", gpus}};
}

}  // namespace tessera::node
