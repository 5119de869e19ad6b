#include "node/mig_gpu.h"

#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "mig/nvml_catalog.h"

namespace tessera::node {

using namespace tessera::abi;

namespace {

constexpr unsigned kMostComputeProfiles = 8;  // NVML_COMPUTE_INSTANCE_PROFILE_*

[[noreturn]] void fail(const Nvml& nvml, const GpuInfo& gpu, const std::string& what,
                       nvmlReturn_t status) {
  throw std::runtime_error(fmt::format("GPU {}: {}: {}", gpu.index, what, nvml.error_text(status)));
}

void require(const Nvml& nvml, const GpuInfo& gpu, const char* call, nvmlReturn_t status) {
  if (status != NVML_SUCCESS) fail(nvml, gpu, call, status);
}

void require_calls(const Nvml& nvml, const GpuInfo& gpu) {
  bool all = true;
#define TESSERA_NVML_PRESENT(name, params) all = all && nvml.name != nullptr;
  TESSERA_NVML_MIG(TESSERA_NVML_PRESENT)
#undef TESSERA_NVML_PRESENT
  if (!all || nvml.nvmlDeviceGetMigMode == nullptr) {
    throw std::runtime_error(
        fmt::format("GPU {}: this NVML ({}) lacks the MIG calls", gpu.index, nvml.library()));
  }
}

nvmlDevice_t handle_of(Nvml& nvml, const GpuInfo& gpu) {
  nvmlDevice_t device = nullptr;
  require(nvml, gpu, "nvmlDeviceGetHandleByUUID",
          nvml.nvmlDeviceGetHandleByUUID(gpu.uuid.c_str(), &device));
  return device;
}

std::vector<unsigned> processes_on(Nvml& nvml, nvmlDevice_t device) {
  std::vector<unsigned> pids;
  if (nvml.nvmlDeviceGetComputeRunningProcesses_v3 == nullptr) return pids;
  nvmlProcessInfo_t infos[64];
  unsigned count = 64;
  if (nvml.nvmlDeviceGetComputeRunningProcesses_v3(device, &count, infos) != NVML_SUCCESS) {
    return pids;
  }
  for (unsigned i = 0; i < count && i < 64; ++i) pids.push_back(infos[i].pid);
  return pids;
}

// The GPU instances of a profile, with what NVML says of each.
std::vector<std::pair<nvmlGpuInstance_t, nvmlGpuInstanceInfo_t>> gpu_instances(
    Nvml& nvml, const GpuInfo& gpu, nvmlDevice_t device, const mig::Profile& profile) {
  nvmlGpuInstance_t handles[8] = {};
  unsigned count = 8;
  require(nvml, gpu, "nvmlDeviceGetGpuInstances",
          nvml.nvmlDeviceGetGpuInstances(device, profile.id, handles, &count));
  std::vector<std::pair<nvmlGpuInstance_t, nvmlGpuInstanceInfo_t>> instances;
  for (unsigned i = 0; i < count && i < 8; ++i) {
    nvmlGpuInstanceInfo_t info{};
    require(nvml, gpu, "nvmlGpuInstanceGetInfo", nvml.nvmlGpuInstanceGetInfo(handles[i], &info));
    instances.emplace_back(handles[i], info);
  }
  return instances;
}

// The compute instance profile that spans the whole GPU instance.
unsigned whole_compute_profile(Nvml& nvml, const GpuInfo& gpu, nvmlGpuInstance_t instance,
                               const mig::Profile& profile) {
  for (unsigned index = 0; index < kMostComputeProfiles; ++index) {
    nvmlComputeInstanceProfileInfo_v2_t info{};
    info.version = nvmlComputeInstanceProfileInfo_v2;
    if (nvml.nvmlGpuInstanceGetComputeInstanceProfileInfoV(
            instance, index, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &info) == NVML_SUCCESS &&
        static_cast<int>(info.sliceCount) == profile.compute_slices) {
      return info.id;
    }
  }
  throw std::runtime_error(fmt::format("GPU {}: {} has no compute instance profile of {} slices",
                                       gpu.index, profile.name, profile.compute_slices));
}

std::vector<nvmlComputeInstance_t> compute_instances(Nvml& nvml, const GpuInfo& gpu,
                                                     nvmlGpuInstance_t instance) {
  std::vector<nvmlComputeInstance_t> found;
  for (unsigned index = 0; index < kMostComputeProfiles; ++index) {
    nvmlComputeInstance_t handles[8] = {};
    unsigned count = 8;
    const nvmlReturn_t status =
        nvml.nvmlGpuInstanceGetComputeInstances(instance, index, handles, &count);
    if (status == NVML_ERROR_NOT_SUPPORTED || status == NVML_ERROR_INVALID_ARGUMENT) continue;
    require(nvml, gpu, "nvmlGpuInstanceGetComputeInstances", status);
    found.insert(found.end(), handles, handles + std::min(count, 8u));
  }
  return found;
}

}  // namespace

std::vector<mig::Existing> MigGpu::existing() const {
  std::vector<mig::Existing> list;
  for (const MigInstance& instance : instances) list.push_back(instance.existing);
  return list;
}

mig::Layout MigGpu::layout() const {
  mig::Layout list;
  for (const MigInstance& instance : instances) list.push_back(instance.existing.instance);
  return list;
}

MigGpu read_mig_gpu(Nvml& nvml, const GpuInfo& gpu) {
  require_calls(nvml, gpu);
  MigGpu state;
  state.gpu = gpu;
  nvmlDevice_t device = handle_of(nvml, gpu);
  unsigned current = 0, pending = 0;
  require(nvml, gpu, "nvmlDeviceGetMigMode", nvml.nvmlDeviceGetMigMode(device, &current, &pending));
  state.enabled = current == NVML_DEVICE_MIG_ENABLE;
  state.pending_enabled = pending == NVML_DEVICE_MIG_ENABLE;
  nvmlPciInfo_t pci{};
  if (nvml.nvmlDeviceGetPciInfo_v3 != nullptr &&
      nvml.nvmlDeviceGetPciInfo_v3(device, &pci) == NVML_SUCCESS) {
    state.pci_device_id = pci.pciDeviceId;
  }
  mig::NvmlCatalog catalog = mig::read_nvml_catalog(
      {nvml.nvmlDeviceGetGpuInstanceProfileInfoV,
       nvml.nvmlDeviceGetGpuInstancePossiblePlacements_v2},
      device, gpu.name, [&](nvmlReturn_t status) { return nvml.error_text(status); });
  if (const mig::GpuModel* builtin = mig::find_model(gpu.name)) {
    if (catalog.model.profiles.empty()) catalog.model = *builtin;  // NVML gave none: ours
    catalog.model.key = builtin->key;
  }
  if (catalog.model.profiles.empty()) {
    throw std::runtime_error(
        fmt::format("GPU {} ({}): no MIG profiles: {}", gpu.index, gpu.name,
                    catalog.notes.empty() ? "none known" : catalog.notes.front()));
  }
  auto model = std::make_shared<const mig::GpuModel>(std::move(catalog.model));
  state.model = model;
  state.processes = processes_on(nvml, device);
  if (!state.enabled) return state;

  for (const mig::Profile& profile : model->profiles) {
    for (const auto& [handle, info] : gpu_instances(nvml, gpu, device, profile)) {
      MigInstance instance;
      instance.existing = {{&profile, static_cast<int>(info.placement.start)}, info.id, false};
      state.instances.push_back(std::move(instance));
    }
  }
  std::sort(state.instances.begin(), state.instances.end(),
            [](const MigInstance& a, const MigInstance& b) {
              return a.existing.instance.start < b.existing.instance.start;
            });
  // MIG devices, by index, matched to their GPU instance.
  unsigned most = 0;
  require(nvml, gpu, "nvmlDeviceGetMaxMigDeviceCount",
          nvml.nvmlDeviceGetMaxMigDeviceCount(device, &most));
  for (unsigned index = 0; index < most; ++index) {
    nvmlDevice_t handle = nullptr;
    const nvmlReturn_t status = nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, index, &handle);
    if (status == NVML_ERROR_NOT_FOUND || status == NVML_ERROR_INVALID_ARGUMENT) continue;
    require(nvml, gpu, "nvmlDeviceGetMigDeviceHandleByIndex", status);
    unsigned gi = 0, ci = 0;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    nvmlMemory_t memory{};
    require(nvml, gpu, "nvmlDeviceGetGpuInstanceId", nvml.nvmlDeviceGetGpuInstanceId(handle, &gi));
    require(nvml, gpu, "nvmlDeviceGetComputeInstanceId",
            nvml.nvmlDeviceGetComputeInstanceId(handle, &ci));
    require(nvml, gpu, "nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID(handle, uuid, sizeof uuid));
    require(nvml, gpu, "nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo(handle, &memory));
    nvmlDeviceAttributes_t attributes{};
    const int sms = nvml.nvmlDeviceGetAttributes_v2 != nullptr &&
                            nvml.nvmlDeviceGetAttributes_v2(handle, &attributes) == NVML_SUCCESS
                        ? static_cast<int>(attributes.multiprocessorCount)
                        : 0;
    for (MigInstance& instance : state.instances) {
      if (instance.existing.id != gi) continue;
      instance.devices.push_back({uuid, ci, memory.total, sms});
      instance.existing.in_use = instance.existing.in_use || !processes_on(nvml, handle).empty();
    }
  }
  return state;
}

void add_mig_devices(Nvml& nvml, Inventory& inventory) {
  for (GpuInfo& gpu : inventory.gpus) {
    gpu.mig_devices.clear();
    if (!gpu.mig_enabled) continue;
    const MigGpu state = read_mig_gpu(nvml, gpu);
    for (const MigInstance& instance : state.instances) {
      for (const MigDevice& device : instance.devices) {
        gpu.mig_devices.push_back({device.uuid, instance.existing.instance.profile->name,
                                   static_cast<int>(gpu.mig_devices.size()), instance.existing.id,
                                   device.compute_instance, instance.existing.instance.start,
                                   device.memory_bytes, device.sm_count});
      }
    }
  }
}

bool set_mig_mode(Nvml& nvml, const MigGpu& gpu, bool enabled) {
  require_calls(nvml, gpu.gpu);
  nvmlReturn_t activation = NVML_SUCCESS;
  const nvmlReturn_t status = nvml.nvmlDeviceSetMigMode(
      handle_of(nvml, gpu.gpu), enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE,
      &activation);
  if (status == NVML_ERROR_IN_USE) {
    throw std::runtime_error(
        fmt::format("GPU {}: MIG cannot be turned off while GPU instances exist", gpu.gpu.index));
  }
  require(nvml, gpu.gpu, "nvmlDeviceSetMigMode", status);
  return activation == NVML_SUCCESS;
}

void apply_steps(Nvml& nvml, const MigGpu& gpu, const std::vector<mig::Step>& steps) {
  require_calls(nvml, gpu.gpu);
  nvmlDevice_t device = handle_of(nvml, gpu.gpu);
  // What undoes each step done so far, newest last.
  std::vector<std::pair<std::string, std::function<nvmlReturn_t()>>> undo;

  auto create = [&](const mig::Instance& instance) -> nvmlReturn_t {
    const mig::Profile& profile = *instance.profile;
    const nvmlGpuInstancePlacement_t placement{static_cast<unsigned>(instance.start),
                                               static_cast<unsigned>(profile.memory_slices)};
    nvmlGpuInstance_t created = nullptr;
    nvmlReturn_t status =
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, profile.id, &placement, &created);
    if (status != NVML_SUCCESS) return status;
    nvmlComputeInstance_t compute = nullptr;
    status = nvml.nvmlGpuInstanceCreateComputeInstance(
        created, whole_compute_profile(nvml, gpu.gpu, created, profile), &compute);
    if (status != NVML_SUCCESS) {
      nvml.nvmlGpuInstanceDestroy(created);
      return status;
    }
    undo.emplace_back(fmt::format("destroy the {} made at slice {}", profile.name, instance.start),
                      [&nvml, created, compute] {
                        const nvmlReturn_t destroyed = nvml.nvmlComputeInstanceDestroy(compute);
                        return destroyed != NVML_SUCCESS ? destroyed
                                                         : nvml.nvmlGpuInstanceDestroy(created);
                      });
    return NVML_SUCCESS;
  };

  auto roll_back = [&](const std::string& failed) {
    std::string left;
    const auto done = std::move(undo);  // undoing a destroy records a create: not in this list
    undo.clear();
    for (auto step = done.rbegin(); step != done.rend(); ++step) {
      if (const nvmlReturn_t status = step->second(); status != NVML_SUCCESS) {
        left += fmt::format("; could not {}: {}", step->first, nvml.error_text(status));
      }
    }
    throw std::runtime_error(fmt::format(
        "GPU {}: {}; {}", gpu.gpu.index, failed,
        left.empty()
            ? "rolled back: the GPU has the layout it had (its GPU instance IDs may differ)"
            : "rolling back failed" + left));
  };

  for (const mig::Step& step : steps) {
    const mig::Profile& profile = *step.instance.profile;
    if (step.kind == mig::Step::Kind::destroy) {
      nvmlGpuInstance_t instance = nullptr;
      for (const auto& [handle, info] : gpu_instances(nvml, gpu.gpu, device, profile)) {
        if (info.id == step.id) instance = handle;
      }
      if (instance == nullptr) {
        roll_back(fmt::format("GPU instance {} ({}) is gone", step.id, profile.name));
      }
      for (const nvmlComputeInstance_t compute : compute_instances(nvml, gpu.gpu, instance)) {
        if (const nvmlReturn_t status = nvml.nvmlComputeInstanceDestroy(compute);
            status != NVML_SUCCESS) {
          roll_back(fmt::format("destroying a compute instance of GPU instance {}: {}", step.id,
                                nvml.error_text(status)));
        }
      }
      if (const nvmlReturn_t status = nvml.nvmlGpuInstanceDestroy(instance);
          status != NVML_SUCCESS) {
        roll_back(fmt::format("destroying GPU instance {} ({}): {}", step.id, profile.name,
                              nvml.error_text(status)));
      }
      const mig::Instance destroyed = step.instance;
      undo.emplace_back(fmt::format("make the {} at slice {} again", profile.name, destroyed.start),
                        [&create, destroyed] { return create(destroyed); });
    } else if (const nvmlReturn_t status = create(step.instance); status != NVML_SUCCESS) {
      roll_back(fmt::format("creating {} at slice {}: {}", profile.name, step.instance.start,
                            nvml.error_text(status)));
    }
  }
}

}  // namespace tessera::node
