#include "mig/nvml_catalog.h"

#include <algorithm>
#include <cstring>

namespace tessera::mig {

using namespace tessera::abi;

namespace {

std::string starts_text(const std::vector<int>& starts) {
  std::string text;
  for (const int start : starts) text += (text.empty() ? "" : ",") + std::to_string(start);
  return "{" + text + "}";
}

// "MIG 1g.10gb" -> "1g.10gb", as nvidia-smi and mig-parted name profiles.
std::string profile_name(const char* reported) {
  std::string name(reported, strnlen(reported, sizeof(nvmlGpuInstanceProfileInfo_v2_t::name)));
  if (name.rfind("MIG ", 0) == 0) name.erase(0, 4);
  return name;
}

}  // namespace

NvmlCatalog read_nvml_catalog(const NvmlProfileCalls& calls, nvmlDevice_t device,
                              const std::string& gpu_name,
                              const std::function<std::string(nvmlReturn_t)>& error_text) {
  NvmlCatalog catalog;
  catalog.model.key = gpu_name;
  catalog.model.names = {gpu_name};
  auto note = [&](unsigned index, const char* call, nvmlReturn_t status) {
    catalog.notes.push_back("profile " + std::to_string(index) + ": " + call + ": " +
                            error_text(status));
  };
  if (calls.profile_info == nullptr || calls.placements == nullptr) {
    catalog.notes.emplace_back("this NVML lacks the MIG profile calls");
    return catalog;
  }
  nvmlReturn_t lacked = NVML_SUCCESS;  // what NVML said of a profile the GPU lacks
  for (unsigned index = 0; index < kProfileCount; ++index) {
    nvmlGpuInstanceProfileInfo_v2_t info{};
    info.version = nvmlGpuInstanceProfileInfo_v2;
    const nvmlReturn_t status = calls.profile_info(device, index, &info);
    if (status == NVML_ERROR_NOT_SUPPORTED || status == NVML_ERROR_INVALID_ARGUMENT) {
      lacked = status;
      continue;
    }
    if (status != NVML_SUCCESS) {
      note(index, "nvmlDeviceGetGpuInstanceProfileInfoV", status);
      continue;
    }
    Profile profile;
    profile.name = profile_name(info.name);
    profile.nvml_profile = index;
    profile.id = info.id;
    profile.compute_slices = static_cast<int>(info.sliceCount);
    profile.most = static_cast<int>(info.instanceCount);
    profile.memory_mib = info.memorySizeMB;
    profile.sm_count = static_cast<int>(info.multiprocessorCount);
    profile.media = profile.name.find("+me") != std::string::npos;
    nvmlGpuInstancePlacement_t placements[16] = {};
    unsigned count = 16;
    const nvmlReturn_t placed = calls.placements(device, info.id, placements, &count);
    if (placed != NVML_SUCCESS) {
      note(index, "nvmlDeviceGetGpuInstancePossiblePlacements_v2", placed);
      count = 0;
    }
    for (unsigned i = 0; i < std::min(count, 16u); ++i) {
      profile.starts.push_back(static_cast<int>(placements[i].start));
      profile.memory_slices = static_cast<int>(placements[i].size);
    }
    std::sort(profile.starts.begin(), profile.starts.end());
    catalog.model.compute_slices = std::max(catalog.model.compute_slices, profile.compute_slices);
    catalog.model.memory_slices =
        std::max(catalog.model.memory_slices, profile.memory_slices);  // the 7g takes them all
    catalog.model.profiles.push_back(std::move(profile));
  }
  if (catalog.model.profiles.empty() && lacked != NVML_SUCCESS) {
    catalog.notes.push_back("no profile: nvmlDeviceGetGpuInstanceProfileInfoV: " +
                            error_text(lacked));
  }
  return catalog;
}

std::vector<std::string> catalog_differences(const GpuModel& expected, const GpuModel& reported) {
  std::vector<std::string> differences;
  for (const Profile& want : expected.profiles) {
    const Profile* got = reported.profile_with_nvml_index(want.nvml_profile);
    if (got == nullptr) {
      differences.push_back(want.name + ": not reported");
      continue;
    }
    auto differ = [&](const char* field, const std::string& ours, const std::string& theirs) {
      if (ours != theirs) {
        differences.push_back(want.name + ": " + field + " " + ours + " here, " + theirs +
                              " reported");
      }
    };
    differ("name", want.name, got->name);
    differ("ID", std::to_string(want.id), std::to_string(got->id));
    differ("compute slices", std::to_string(want.compute_slices),
           std::to_string(got->compute_slices));
    differ("memory slices", std::to_string(want.memory_slices), std::to_string(got->memory_slices));
    differ("most instances", std::to_string(want.most), std::to_string(got->most));
    differ("memory MiB", std::to_string(want.memory_mib), std::to_string(got->memory_mib));
    differ("SMs", std::to_string(want.sm_count), std::to_string(got->sm_count));
    differ("starts", starts_text(want.starts), starts_text(got->starts));
  }
  for (const Profile& got : reported.profiles) {
    if (expected.profile_with_nvml_index(got.nvml_profile) == nullptr) {
      differences.push_back(got.name + ": reported, not in the catalog");
    }
  }
  return differences;
}

}  // namespace tessera::mig
