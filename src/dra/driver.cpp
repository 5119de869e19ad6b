#include "dra/driver.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "base/files.h"
#include "base/yaml_document.h"
#include "common/limits.h"
#include "contract/limit_variables.h"
#include "contract/variables.h"
#include "dra/cdi.h"
#include "kube/json_input.h"

namespace tessera::dra {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr auto kClaimReadBudget = std::chrono::seconds(5);
constexpr std::size_t kMostCheckpointBytes = 1 << 20;

const char* kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::whole:
      return "whole";
    case DeviceKind::shared:
      return "shared";
    case DeviceKind::mig:
      return "mig";
    case DeviceKind::mig_placement:
      return "mig-placement";
  }
  return "?";
}

DeviceKind kind_named(const std::string& name) {
  for (const DeviceKind kind :
       {DeviceKind::whole, DeviceKind::shared, DeviceKind::mig, DeviceKind::mig_placement}) {
    if (name == kind_name(kind)) return kind;
  }
  throw std::runtime_error(fmt::format("kind '{}' is not a device kind", name));
}

}  // namespace

bool valid_claim_uid(const std::string& uid) {
  return !uid.empty() && uid.size() <= 64 && std::all_of(uid.begin(), uid.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

DraDriver::DraDriver(DraDriverOptions options, const node::Inventory& inventory,
                     const node::HealthBoard& health, node::ContainerGrants& grants,
                     const kube::Cluster& cluster,
                     std::function<node::PluginConfig()> served_config, base::Reporter report)
    : options_(std::move(options)),
      inventory_(inventory),
      health_(health),
      grants_(grants),
      cluster_(cluster),
      served_config_(std::move(served_config)),
      report_(std::move(report)) {}

std::string DraDriver::checkpoint_path(const std::string& uid) const {
  return options_.checkpoint_dir + "/" + uid + ".json";
}

json DraDriver::checkpoint_json(const Prepared& prepared) {
  json held = json::array();
  for (const Held& h : prepared.held) {
    held.push_back({{"device", h.device},
                    {"kind", kind_name(h.kind)},
                    {"gpu", h.gpu},
                    {"memoryBytes", h.memory_bytes},
                    {"cores", h.cores}});
  }
  json answer = json::array();
  for (const PreparedDevice& device : prepared.answer) {
    answer.push_back({{"requests", device.request_names},
                      {"pool", device.pool},
                      {"device", device.device},
                      {"cdiDeviceIDs", device.cdi_device_ids}});
  }
  return {{"claim",
           {{"namespace", prepared.claim.name_space},
            {"uid", prepared.claim.uid},
            {"name", prepared.claim.name}}},
          {"held", held},
          {"answer", answer}};
}

DraDriver::Prepared DraDriver::checkpoint_from_json(const json& json) {
  Prepared prepared;
  const auto& claim = json.at("claim");
  prepared.claim = {claim.at("namespace").get<std::string>(), claim.at("uid").get<std::string>(),
                    claim.at("name").get<std::string>()};
  for (const auto& h : json.at("held")) {
    prepared.held.push_back({h.at("device").get<std::string>(),
                             kind_named(h.at("kind").get<std::string>()), h.at("gpu").get<int>(),
                             h.at("memoryBytes").get<std::uint64_t>(), h.at("cores").get<int>()});
  }
  for (const auto& device : json.at("answer")) {
    prepared.answer.push_back({device.at("requests").get<std::vector<std::string>>(),
                               device.at("pool").get<std::string>(),
                               device.at("device").get<std::string>(),
                               device.at("cdiDeviceIDs").get<std::vector<std::string>>()});
  }
  return prepared;
}

void DraDriver::restore() {
  for (const std::string& directory : {options_.checkpoint_dir, options_.cdi_dir}) {
    std::error_code error;
    fs::create_directories(directory, error);
    if (error) {
      throw std::runtime_error(fmt::format("cannot create {}: {}", directory, error.message()));
    }
  }
  base::MutexLock locked(mutex_);
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(options_.checkpoint_dir, error)) {
    const std::string path = entry.path().string();
    if (entry.path().extension() != ".json") continue;
    try {
      Prepared prepared = checkpoint_from_json(
          kube::parse_outside_json(base::read_file_bounded(path, kMostCheckpointBytes)));
      if (!valid_claim_uid(prepared.claim.uid) ||
          entry.path().stem().string() != prepared.claim.uid) {
        throw std::runtime_error("it names another claim than its file");
      }
      const std::string uid = prepared.claim.uid;
      prepared_[uid] = std::move(prepared);
    } catch (const std::exception& unreadable) {
      // Kept for a person to read; Unprepare of its claim still removes what was made.
      base::tell(report_, fmt::format("dra: checkpoint {} is not readable and is skipped: {}", path,
                                      unreadable.what()));
    }
  }
  if (!prepared_.empty()) {
    base::tell(report_,
               fmt::format("dra: {} claim(s) prepared before this start", prepared_.size()));
  }
}

std::size_t DraDriver::prepared() const {
  base::MutexLock locked(mutex_);
  return prepared_.size();
}

std::vector<DraDriver::Held> DraDriver::check(const std::vector<AllocatedDevice>& devices) const {
  const SharedDefaults defaults = shared_defaults(served_config_());
  std::vector<Held> held;
  for (const AllocatedDevice& allocated : devices) {
    const std::optional<PublishedDevice> device =
        find_published_device(inventory_, allocated.device);
    if (!device) {
      throw ClaimError(fmt::format("device '{}' is not one this node publishes", allocated.device));
    }
    if (device->kind == DeviceKind::mig_placement) {
      throw ClaimError(fmt::format(
          "device '{}' is a possible MIG placement; MIG devices are not made on demand yet",
          allocated.device));
    }
    if (!health_.healthy(device->gpu)) {
      throw ClaimError(fmt::format("device '{}' is on GPU {}, which is unhealthy ({})",
                                   allocated.device, device->gpu, health_.reason(device->gpu)));
    }
    Held h{allocated.device, device->kind, device->gpu};
    if (device->kind == DeviceKind::shared) {
      // kube-scheduler records what a claim consumed, defaults included; one allocated by
      // another means gets the node's defaults, as the slices state them.
      h.memory_bytes = allocated.memory_bytes.value_or(
          defaults.memory_on(inventory_.gpus[static_cast<std::size_t>(device->gpu)]));
      h.cores = allocated.cores.value_or(defaults.cores_or_default());
    }
    held.push_back(h);
  }
  // Against what other claims hold, and within the claim itself.
  auto conflict = [&](const Held& a, const Held& b) {
    if (a.gpu != b.gpu) return false;
    if (a.kind == DeviceKind::mig || b.kind == DeviceKind::mig) return a.device == b.device;
    return !(a.kind == DeviceKind::shared && b.kind == DeviceKind::shared);
  };
  std::map<int, std::pair<std::uint64_t, int>> shared_use;  // GPU -> memory, cores
  for (const auto& [uid, prepared] : prepared_) {
    for (const Held& other : prepared.held) {
      for (const Held& mine : held) {
        if (conflict(mine, other)) {
          throw ClaimError(fmt::format("device '{}' conflicts with '{}', prepared for claim {}",
                                       mine.device, other.device, prepared.claim.label()));
        }
      }
      if (other.kind == DeviceKind::shared) {
        shared_use[other.gpu].first += other.memory_bytes;
        shared_use[other.gpu].second += other.cores;
      }
    }
  }
  for (std::size_t i = 0; i < held.size(); ++i) {
    for (std::size_t j = i + 1; j < held.size(); ++j) {
      if (conflict(held[i], held[j]) || (held[i].device == held[j].device)) {
        throw ClaimError(fmt::format("devices '{}' and '{}' of one claim take the same GPU",
                                     held[i].device, held[j].device));
      }
    }
    if (held[i].kind != DeviceKind::shared) continue;
    auto& [memory, cores] = shared_use[held[i].gpu];
    const std::uint64_t capacity =
        inventory_.gpus[static_cast<std::size_t>(held[i].gpu)].memory_bytes;
    if (held[i].memory_bytes > capacity) {
      throw ClaimError(fmt::format("device '{}': {} MiB is more than GPU {} has ({} MiB)",
                                   held[i].device, held[i].memory_bytes >> 20, held[i].gpu,
                                   capacity >> 20));
    }
    memory += held[i].memory_bytes;
    cores += held[i].cores;
    if (memory > capacity || cores > 100) {
      throw ClaimError(fmt::format(
          "device '{}': the claims sharing GPU {} would hold {} MiB of {} and {} of 100 cores",
          held[i].device, held[i].gpu, memory >> 20, capacity >> 20, cores));
    }
  }
  return held;
}

DraDriver::Prepared DraDriver::make(const ClaimRef& claim,
                                    const std::vector<AllocatedDevice>& devices,
                                    std::vector<Held> held) {
  Prepared prepared{claim, std::move(held), {}};
  // One priority and one way of sharing for the claim: its containers share one ledger.
  const SharingConfig& sharing = devices.front().sharing;
  for (const AllocatedDevice& device : devices) {
    if (!(device.sharing == sharing)) {
      throw ClaimError(fmt::format(
          "requests '{}' and '{}' have different sharing configs; one claim shares one way",
          devices.front().request, device.request));
    }
  }
  node::PluginConfig config = served_config_();
  config.flags.pass_device_specs = true;

  node::ContainerGrant grant;
  grant.priority = sharing.priority;
  grant.burst = sharing.burst;
  grant.source = fmt::format("claim {} ({})", claim.label(), strategy_name(sharing.strategy));
  bool shares = sharing.priority != Priority::none;
  std::vector<node::DeviceRef> refs;
  std::vector<CdiDevice> cdi_devices;
  for (std::size_t i = 0; i < prepared.held.size(); ++i) {
    const Held& h = prepared.held[i];
    const PublishedDevice device = *find_published_device(inventory_, h.device);
    const node::DeviceRef ref{device.gpu, device.mig};
    refs.push_back(ref);
    cdi_devices.push_back(
        {claim.uid + "-" + h.device, node::device_nodes(inventory_, config, {ref})});
    if (std::find(grant.gpus.begin(), grant.gpus.end(), h.gpu) != grant.gpus.end()) continue;
    grant.gpus.push_back(h.gpu);
    const bool limited = h.kind == DeviceKind::shared;
    shares = shares || limited;
    grant.memory_bytes.push_back(limited ? h.memory_bytes : kUnlimited);
    grant.cores.push_back(limited && sharing.strategy == SharingConfig::Strategy::limits ? h.cores
                                                                                         : 0);
  }
  node::ContainerAllocation common = node::expose_devices(inventory_, config, refs, claim.uid);
  common.devices.clear();  // each CDI device carries its own
  if (sharing.strategy == SharingConfig::Strategy::mps) {
    if (sharing.mps_thread_percentage > 0) {
      common.envs[contract::kMpsThreadPercentageVariable] =
          std::to_string(sharing.mps_thread_percentage);
    }
    if (sharing.mps_pinned_memory_bytes > 0) {
      common.envs[contract::kMpsMemoryLimitVariable] =
          fmt::format("0={}M", sharing.mps_pinned_memory_bytes >> 20);
    }
  }
  std::vector<std::string> names;
  for (const Held& h : prepared.held) names.push_back(h.device);
  if (shares) grants_.claim_container(common, inventory_, claim.uid, names, grant);
  const std::string spec_path = cdi_spec_path(options_.cdi_dir, claim.uid);
  if (const base::Status written =
          base::write_file_atomically(spec_path, cdi_spec(common, cdi_devices).dump(2));
      !written.ok()) {
    throw ClaimError(written.message());
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    prepared.answer.push_back({{devices[i].request},
                               devices[i].pool,
                               devices[i].device,
                               {cdi_device_id(cdi_devices[i].name)}});
  }
  if (const base::Status written =
          base::write_file_atomically(checkpoint_path(claim.uid), checkpoint_json(prepared).dump());
      !written.ok()) {
    throw ClaimError(written.message());
  }
  base::tell(report_,
             fmt::format("dra: prepared claim {} ({}): {}; memory {}, cores {}, priority {}",
                         claim.label(), claim.uid, fmt::join(names, ","),
                         fmt::join(grant.memory_bytes, ","), fmt::join(grant.cores, ","),
                         priority_name(grant.priority)));
  return prepared;
}

void DraDriver::remove_made(const std::string& uid, std::vector<std::string>& failures) const {
  std::error_code error;
  for (const std::string& path : {cdi_spec_path(options_.cdi_dir, uid), checkpoint_path(uid)}) {
    fs::remove(path, error);
    if (error) failures.push_back(fmt::format("cannot remove {}: {}", path, error.message()));
  }
  if (const base::Status removed = grants_.remove_claim_container(uid); !removed.ok()) {
    failures.push_back(removed.message());
  }
}

PrepareAnswer DraDriver::prepare(const ClaimRef& claim) {
  PrepareAnswer answer = prepare_claim(claim);
  ++(answer.error.empty() ? answers_prepared_ : answers_refused_);
  return answer;
}

PrepareAnswer DraDriver::prepare_claim(const ClaimRef& claim) {
  PrepareAnswer answer;
  if (!valid_claim_uid(claim.uid)) {
    answer.error = fmt::format("claim UID '{}' is not a UID", claim.uid.substr(0, 64));
    return answer;
  }
  {
    base::MutexLock locked(mutex_);
    if (const auto found = prepared_.find(claim.uid); found != prepared_.end()) {
      answer.devices = found->second.answer;  // the kubelet's retry: the same answer
      return answer;
    }
  }
  const kube::ApiResponse response = cluster_.get_resource_claim(
      {claim.name_space, claim.name}, std::chrono::steady_clock::now() + kClaimReadBudget);
  if (response.status != 200) {
    answer.error = fmt::format(
        "cannot read claim {}: {}", claim.label(),
        response.status == 0 ? response.error : fmt::format("HTTP {}", response.status));
    return answer;
  }
  try {
    const std::vector<AllocatedDevice> devices =
        read_claim_allocation(kube::parse_outside_json(response.body), claim, options_.driver,
                              pool_name(options_.node_name));
    base::MutexLock locked(mutex_);
    if (const auto found = prepared_.find(claim.uid); found != prepared_.end()) {
      answer.devices = found->second.answer;  // prepared meanwhile by a concurrent retry
      return answer;
    }
    Prepared prepared;
    try {
      prepared = make(claim, devices, check(devices));
    } catch (...) {
      std::vector<std::string> ignored;
      remove_made(claim.uid, ignored);  // nothing half-made stays behind
      throw;
    }
    answer.devices = prepared.answer;
    prepared_[claim.uid] = std::move(prepared);
  } catch (const std::exception& refused) {
    answer.error = fmt::format("claim {}: {}", claim.label(), refused.what());
    base::tell(report_, "dra: " + answer.error);
  }
  return answer;
}

std::string DraDriver::unprepare(const ClaimRef& claim) {
  if (!valid_claim_uid(claim.uid)) {
    return fmt::format("claim UID '{}' is not a UID", claim.uid.substr(0, 64));
  }
  base::MutexLock locked(mutex_);
  std::vector<std::string> failures;
  remove_made(claim.uid, failures);
  if (!failures.empty()) return fmt::format("{}", fmt::join(failures, "; "));
  if (prepared_.erase(claim.uid) > 0) {
    base::tell(report_, fmt::format("dra: unprepared claim {} ({})", claim.label(), claim.uid));
  }
  return "";
}

}  // namespace tessera::dra
