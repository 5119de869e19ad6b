// tessera mig: MIG layouts planned against each GPU's placement rules before anything is
// touched, applied with explicit placements and the fewest changes, rolled back on failure;
// the layout as a picture of the slots; and advice on which layout fits a workload mix.
#include <dlfcn.h>
#include <fmt/core.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "base/yaml_document.h"
#include "cli/commands.h"
#include "cli/environment.h"
#include "common/units.h"
#include "kube/json_input.h"
#include "kube/objects.h"
#include "mig/advisor.h"
#include "mig/parted_config.h"
#include "node/config.h"
#include "node/mig_gpu.h"

namespace tessera::cli {
namespace {

// A config or pod list file, at most 16 MiB (a cluster's pods, as kubectl lists them).
std::string read_config_file(const std::string& path) {
  try {
    return base::read_file_bounded(path, std::size_t{16} << 20);
  } catch (const base::DocumentError& error) {
    throw UsageError(error.what());
  }
}

// The configs the options name: one by -c, or all of the file's.
std::map<std::string, std::vector<mig::PartedEntry>> chosen_configs(const MigOptions& options) {
  if (options.config_file.empty()) throw UsageError("say which layout: --config-file FILE");
  mig::PartedConfig config;
  try {
    config = mig::parse_parted_config(read_config_file(options.config_file), options.config_file);
  } catch (const mig::MigConfigError& error) {
    throw UsageError(error.what());
  }
  if (options.config.empty()) return config.configs;
  const auto found = config.configs.find(options.config);
  if (found == config.configs.end()) {
    std::string names;
    for (const auto& [name, entries] : config.configs) names += (names.empty() ? "" : ", ") + name;
    throw UsageError(fmt::format("{} has no config '{}' (it has: {})", options.config_file,
                                 options.config, names));
  }
  return {*found};
}

std::string counts_text(const mig::ProfileCounts& counts) {
  std::string text;
  for (const auto& [name, count] : counts) {
    if (count > 0) text += fmt::format("{}{} x{}", text.empty() ? "" : ", ", name, count);
  }
  return text.empty() ? "none" : text;
}

struct Machine {
  std::unique_ptr<node::Nvml> nvml;
  node::Inventory inventory;
};
Machine open_machine() {
  const Installation installation = locate_installation();
  Machine machine;
  machine.nvml = std::make_unique<node::Nvml>(
      use_simulated_gpu(installation) ? installation.simulator_dir + "/libnvidia-ml.so.1"
                                      : "libnvidia-ml.so.1");
  machine.inventory = node::read_inventory(*machine.nvml);
  return machine;
}

bool selected(const MigOptions& options, unsigned index) {
  return options.devices.empty() || std::find(options.devices.begin(), options.devices.end(),
                                              static_cast<int>(index)) != options.devices.end();
}

void print_gpu(const node::MigGpu& gpu) {
  fmt::print("GPU {}: {} ({}), MIG {}{}\n", gpu.gpu.index, gpu.gpu.name, gpu.model->key,
             gpu.enabled ? "on" : "off",
             gpu.pending_enabled != gpu.enabled
                 ? fmt::format(" ({} after a reset)", gpu.pending_enabled ? "on" : "off")
                 : "");
  if (!gpu.enabled) return;
  fmt::print("  {}\n", mig::picture(*gpu.model, gpu.layout()));
  for (const node::MigInstance& instance : gpu.instances) {
    for (const node::MigDevice& device : instance.devices) {
      fmt::print("  GPU instance {:<2} {:<12} slice {}  {}  {}{}\n", instance.existing.id,
                 instance.existing.instance.profile->name, instance.existing.instance.start,
                 device.uuid, human_size(device.memory_bytes),
                 instance.existing.in_use ? "  in use" : "");
    }
    if (instance.devices.empty()) {
      fmt::print("  GPU instance {:<2} {:<12} slice {}  (no compute instance)\n",
                 instance.existing.id, instance.existing.instance.profile->name,
                 instance.existing.instance.start);
    }
  }
}

int show(const MigOptions&) {
  Machine machine = open_machine();
  int shown = 0;
  for (const node::GpuInfo& gpu : machine.inventory.gpus) {
    if (!gpu.mig_capable) {
      fmt::print("GPU {}: {}: no MIG\n", gpu.index, gpu.name);
      continue;
    }
    print_gpu(node::read_mig_gpu(*machine.nvml, gpu));
    ++shown;
  }
  if (machine.inventory.gpus.empty()) fmt::print("no GPUs\n");
  return 0;
}

// Offline: each config's layout placed on a model, as a picture.
int plan_for_model(const MigOptions& options) {
  const mig::GpuModel* model = mig::find_model(options.model);
  if (model == nullptr) {
    std::string known;
    for (const mig::GpuModel& each : mig::builtin_catalog())
      known += (known.empty() ? "" : ", ") + each.key;
    throw UsageError(
        fmt::format("--model {}: not a MIG GPU Tessera knows ({})", options.model, known));
  }
  int refused = 0;
  for (const auto& [name, entries] : chosen_configs(options)) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const mig::PartedEntry& entry = entries[i];
      fmt::print("{}[{}] on {}: ", name, i, model->key);
      if (!entry.mig_enabled) {
        fmt::print("MIG off\n");
        continue;
      }
      const mig::Plan plan = mig::place(*model, entry.mig_devices);
      if (!plan.found) {
        ++refused;
        fmt::print("does not fit\n  {}\n", plan.why);
        for (const mig::ProfileCounts& nearest : plan.nearest) {
          fmt::print("  would fit: {}\n", counts_text(nearest));
        }
        continue;
      }
      fmt::print("{}\n  {}\n", counts_text(entry.mig_devices), mig::picture(*model, plan.layout));
    }
  }
  return refused == 0 ? 0 : 1;
}

int plan_or_apply(const MigOptions& options, bool apply) {
  if (!apply && !options.model.empty()) return plan_for_model(options);
  const auto configs = chosen_configs(options);
  if (configs.size() != 1) throw UsageError("say which config of the file: --config NAME");
  const auto& [name, entries] = *configs.begin();
  Machine machine = open_machine();
  for (const int device : options.devices) {
    if (device < 0 || static_cast<std::size_t>(device) >= machine.inventory.gpus.size()) {
      throw UsageError(fmt::format("--device {}: this machine has {} GPU(s)", device,
                                   machine.inventory.gpus.size()));
    }
  }
  int failed = 0, reset_needed = 0, selected_gpus = 0;
  for (const node::GpuInfo& info : machine.inventory.gpus) {
    if (!selected(options, info.index) || !info.mig_capable) continue;
    node::MigGpu gpu = node::read_mig_gpu(*machine.nvml, info);
    const mig::PartedEntry* entry = nullptr;
    try {
      entry = mig::entry_for(entries, name, static_cast<int>(info.index), gpu.pci_device_id);
    } catch (const mig::MigConfigError& error) {
      throw UsageError(error.what());
    }
    if (entry == nullptr) continue;  // this config says nothing of this GPU
    ++selected_gpus;
    const mig::ProfileCounts wanted =
        entry->mig_enabled ? entry->mig_devices : mig::ProfileCounts{};
    fmt::print("GPU {}: {} ({}): {} -> {}\n", info.index, info.name, gpu.model->key,
               gpu.enabled ? counts_text(mig::counts_of(gpu.layout())) : "MIG off",
               entry->mig_enabled ? counts_text(wanted) : "MIG off");
    const mig::Reconciliation steps =
        mig::reconcile(*gpu.model, gpu.existing(), wanted, options.force);
    if (!steps.ok) {
      ++failed;
      fmt::print("  refused: {}\n", steps.why);
      continue;
    }
    if (entry->mig_enabled && !gpu.enabled) {
      // Instances come after the mode, and the mode after a reset.
      if (apply && !node::set_mig_mode(*machine.nvml, gpu, true)) {
        ++reset_needed;
        fmt::print(
            "  MIG mode on is pending: stop the GPU's processes, reset it (nvidia-smi -r -i {0}; "
            "simulated: tessera simgpu reset --device {0}) and apply again\n",
            info.index);
        continue;
      }
      if (!apply) {
        fmt::print("  MIG mode on first (a GPU reset may be needed), then:\n");
      } else {
        gpu = node::read_mig_gpu(*machine.nvml, info);
      }
    }
    for (const mig::Step& step : steps.steps) {
      fmt::print(
          "  {} {} at slice {}{}\n", step.kind == mig::Step::Kind::destroy ? "destroy" : "create",
          step.instance.profile->name, step.instance.start,
          step.kind == mig::Step::Kind::destroy ? fmt::format(" (GPU instance {})", step.id) : "");
    }
    if (steps.steps.empty()) fmt::print("  nothing to change\n");
    fmt::print("  {}\n", mig::picture(*gpu.model, steps.result));
    if (!apply) continue;
    if (gpu.enabled) {
      try {
        node::apply_steps(*machine.nvml, gpu, steps.steps);
      } catch (const std::runtime_error& error) {
        ++failed;
        fmt::print("  failed: {}\n", error.what());
        continue;
      }
    }
    if (!entry->mig_enabled && gpu.enabled && !node::set_mig_mode(*machine.nvml, gpu, false)) {
      ++reset_needed;
      fmt::print(
          "  MIG mode off is pending: reset the GPU (nvidia-smi -r -i {0}; simulated: "
          "tessera simgpu reset --device {0})\n",
          info.index);
    }
  }
  if (selected_gpus == 0) {
    fmt::print("config {} selects none of this machine's MIG-capable GPUs: nothing to do\n", name);
  }
  if (failed > 0) return 1;
  return reset_needed > 0 ? kResetNeededStatus : 0;
}

// "3x9GiB", "1x35GiB@3": COUNT x MEMORY [@ COMPUTE_SLICES].
void add_jobs(const std::string& text, std::vector<mig::Job>& jobs) {
  const std::size_t x = text.find('x');
  const std::size_t at = text.find('@');
  const std::string count_text = x == std::string::npos ? "1" : text.substr(0, x);
  const std::string memory_text = text.substr(
      x == std::string::npos ? 0 : x + 1,
      at == std::string::npos ? std::string::npos : at - (x == std::string::npos ? 0 : x + 1));
  char* end = nullptr;
  const unsigned long count = std::strtoul(count_text.c_str(), &end, 10);
  std::uint64_t bytes = 0;
  long slices = 1;
  if (at != std::string::npos) slices = std::strtol(text.c_str() + at + 1, nullptr, 10);
  if (count_text.empty() || *end != '\0' || count == 0 || count > 1000 ||
      !parse_size(memory_text, bytes) || bytes == 0 || slices < 1 || slices > 8) {
    throw UsageError(fmt::format(
        "--job '{}': write COUNTxMEMORY[@COMPUTE_SLICES], e.g. 3x9GiB or 1x35GiB@3", text));
  }
  for (unsigned long i = 0; i < count; ++i) {
    jobs.push_back({text, (bytes + (1 << 20) - 1) >> 20, static_cast<int>(slices)});
  }
}

// Jobs from a pod list (kubectl get pods -o json: a Pod, a List, or an array): a MIG pod's
// profile (nvidia.com/mig-<profile>), or HAMi's nvidia.com/gpumem[-percentage] and gpucores
// per GPU, or a whole GPU.
void add_pod_jobs(const std::string& path, const mig::GpuModel& model,
                  std::vector<mig::Job>& jobs) {
  nlohmann::json document;
  try {
    document = kube::parse_outside_json(read_config_file(path));
  } catch (const std::exception& error) {
    throw UsageError(fmt::format("{}: not JSON: {}", path, error.what()));
  }
  const nlohmann::json items = document.is_array() ? document
                               : document.is_object() && document.contains("items")
                                   ? document["items"]
                                   : nlohmann::json::array({document});
  if (!items.is_array()) throw UsageError(fmt::format("{}: items must be a list of pods", path));
  const mig::Profile* whole = nullptr;
  for (const mig::Profile& profile : model.profiles) {
    if (whole == nullptr || profile.memory_mib > whole->memory_mib) whole = &profile;
  }
  for (const nlohmann::json& item : items) {
    kube::PodRequest pod;
    try {
      pod = kube::pod_from_json(item);
    } catch (const std::exception& error) {
      throw UsageError(fmt::format("{}: {}", path, error.what()));
    }
    const std::string name = pod.namespace_name + "/" + pod.name;
    // MIG profiles asked for by name, container by container.
    bool asked_mig = false;
    const nlohmann::json spec =
        item.is_object() ? item.value("spec", nlohmann::json::object()) : nlohmann::json::object();
    const nlohmann::json containers = spec.is_object()
                                          ? spec.value("containers", nlohmann::json::array())
                                          : nlohmann::json::array();
    for (const nlohmann::json& container : containers) {
      const nlohmann::json* limits = nullptr;
      if (container.is_object() && container.contains("resources") &&
          container["resources"].is_object() && container["resources"].contains("limits") &&
          container["resources"]["limits"].is_object()) {
        limits = &container["resources"]["limits"];
      }
      if (limits == nullptr) continue;
      for (const auto& [resource, value] : limits->items()) {
        if (resource.rfind("nvidia.com/mig-", 0) != 0) continue;
        const std::string wanted = resource.substr(15);
        const mig::Profile* profile = nullptr;
        for (const mig::Profile& candidate : model.profiles) {
          if (mig::resource_profile_name(candidate.name) == wanted) profile = &candidate;
        }
        const long count = value.is_number_integer() ? value.get<long>()
                           : value.is_string()
                               ? std::strtol(value.get<std::string>().c_str(), nullptr, 10)
                               : 0;
        if (profile == nullptr || count < 1 || count > 64) {
          throw UsageError(fmt::format("{}: pod {}: {}: no {} profile of that name, or a bad count",
                                       path, name, resource, model.key));
        }
        for (long i = 0; i < count; ++i) {
          jobs.push_back({name, profile->memory_mib, profile->compute_slices, profile->media});
        }
        asked_mig = true;
      }
    }
    if (asked_mig || pod.gpus == 0) continue;
    std::uint64_t memory = whole->memory_mib;
    if (pod.gpumem_mib > 0) memory = static_cast<std::uint64_t>(pod.gpumem_mib);
    if (pod.gpumem_percent > 0)
      memory = whole->memory_mib * static_cast<std::uint64_t>(pod.gpumem_percent) / 100;
    const int slices =
        pod.gpucores > 0 ? std::max(1, (pod.gpucores * whole->compute_slices + 99) / 100) : 1;
    const bool fractional = pod.gpumem_mib > 0 || pod.gpumem_percent > 0 || pod.gpucores > 0;
    for (int i = 0; i < pod.gpus; ++i) {
      jobs.push_back({name, memory, fractional ? slices : whole->compute_slices});
    }
  }
}

int advise(const MigOptions& options) {
  const mig::GpuModel* model = mig::find_model(options.model);
  if (model == nullptr)
    throw UsageError(fmt::format("--model '{}': not a MIG GPU Tessera knows", options.model));
  if (options.jobs.empty() && options.pods.empty()) {
    throw UsageError("say what runs: --job COUNTxMEMORY[@COMPUTE_SLICES], or --pods FILE");
  }
  std::vector<mig::Job> jobs;
  for (const std::string& text : options.jobs) add_jobs(text, jobs);
  if (!options.pods.empty()) add_pod_jobs(options.pods, *model, jobs);
  if (jobs.size() > 1000) throw UsageError("more than 1000 jobs");
  const mig::Advice advice = mig::advise(*model, jobs, options.gpus);
  for (std::size_t i = 0; i < advice.gpus.size(); ++i) {
    const mig::GpuAdvice& gpu = advice.gpus[i];
    fmt::print("GPU {}: {}\n  {}\n", i, counts_text(mig::counts_of(gpu.layout)),
               mig::picture(*model, gpu.layout));
    std::map<std::string, std::map<std::string, int>> placed;
    for (const auto& [job, profile] : gpu.placed) ++placed[job][profile->name];
    for (const auto& [job, profiles] : placed) {
      for (const auto& [profile, count] : profiles)
        fmt::print("  {} x{} on {}\n", job, count, profile);
    }
    std::string idle;
    for (const mig::Profile* profile : gpu.idle) idle += (idle.empty() ? "" : ", ") + profile->name;
    fmt::print("  unused: {}{}\n", idle.empty() ? "no instance" : idle,
               gpu.free_memory_slices > 0
                   ? fmt::format(", {} of {} memory slices free", gpu.free_memory_slices,
                                 model->memory_slices)
                   : "");
  }
  for (const std::string& job : advice.unplaced) fmt::print("not placed: {}\n", job);
  fmt::print("mig-parted config:\nversion: v1\nmig-configs:\n  tessera-advice:\n");
  for (std::size_t i = 0; i < advice.gpus.size(); ++i) {
    fmt::print("    - devices: [{}]\n      mig-enabled: true\n      mig-devices:\n", i);
    for (const auto& [profile, count] : mig::counts_of(advice.gpus[i].layout)) {
      fmt::print("        \"{}\": {}\n", profile, count);
    }
  }
  return advice.unplaced.empty() ? 0 : 1;
}

}  // namespace

int mig_command(const MigOptions& options) {
  if (options.action == "show") return show(options);
  if (options.action == "plan") return plan_or_apply(options, false);
  if (options.action == "apply") return plan_or_apply(options, true);
  if (options.action == "advise") return advise(options);
  throw UsageError(fmt::format("unknown mig action '{}'", options.action));
}

int simgpu_reset_command(int device) {
  const Installation installation = locate_installation();
  if (installation.simulator_dir.empty())
    throw std::runtime_error("the simulated GPU is not installed");
  const std::string library = installation.simulator_dir + "/libnvidia-ml.so.1";
  node::Nvml nvml(library);
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);  // the one Nvml loaded
  using Reset = abi::nvmlReturn_t (*)(unsigned);
  auto reset =
      reinterpret_cast<Reset>(handle != nullptr ? dlsym(handle, "tesseraSimResetDevice") : nullptr);
  if (reset == nullptr)
    throw std::runtime_error(fmt::format("{} is not Tessera's simulated NVML", library));
  const node::Inventory inventory = node::read_inventory(nvml);
  if (device < 0 || static_cast<std::size_t>(device) >= inventory.gpus.size()) {
    throw UsageError(fmt::format("--device {}: the simulated machine has {} GPU(s)", device,
                                 inventory.gpus.size()));
  }
  const abi::nvmlReturn_t status = reset(static_cast<unsigned>(device));
  if (status == abi::NVML_ERROR_IN_USE) {
    throw std::runtime_error(fmt::format("GPU {} is in use: stop its processes first", device));
  }
  if (status != abi::NVML_SUCCESS)
    throw std::runtime_error(fmt::format("reset failed: {}", nvml.error_text(status)));
  fmt::print("simulated GPU {} reset\n", device);
  return 0;
}

}  // namespace tessera::cli
