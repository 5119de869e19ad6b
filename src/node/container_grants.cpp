#include "node/container_grants.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/limits.h"
#include "contract/annotations.h"
#include "contract/dra.h"
#include "contract/limit_variables.h"
#include "contract/pod_resources.h"
#include "contract/variables.h"
#include "kube/json_input.h"
#include "ledger/demand.h"
#include "ledger/ledger.h"

namespace tessera::node {
namespace {

namespace fs = std::filesystem;
using kube::string_at;

// All the API calls of one PreStartContainer or GetPreferredAllocation together: the kubelet
// waits on them.
constexpr auto kCallBudget = std::chrono::seconds(8);
// A container given devices but never started (its pod deleted first) is forgotten after this.
constexpr auto kUnstartedKept = std::chrono::hours(24);

std::string id_list(const std::vector<std::string>& ids) {
  return fmt::format("{}", fmt::join(ids, ","));
}

// The pod's tessera.io/assignment on this node, if it has a readable one.
std::optional<kube::RecordedAssignment> assignment_here(const nlohmann::json& pod,
                                                        const std::string& node) {
  const nlohmann::json* text =
      kube::find_at(pod, {"metadata", "annotations", contract::kAssignmentAnnotation});
  if (text == nullptr) return std::nullopt;
  try {
    kube::RecordedAssignment record = kube::assignment_from_annotation(*text);
    if (record.node == node) return record;
  } catch (const std::exception&) {  // the extender reports a damaged record
  }
  return std::nullopt;
}

// The GPUs a container's device IDs stand for, with their share of the IDs.
std::map<int, int> ids_per_gpu(const Resource& resource, const std::vector<std::string>& ids) {
  std::map<int, int> count;
  for (const std::string& id : ids) ++count[resource.find(id)->gpu];
  return count;
}

}  // namespace

// --- decisions --------------------------------------------------------------------------------

ContainerGrant default_grant(const Inventory& inventory, const Resource& resource,
                             const std::vector<std::string>& ids) {
  ContainerGrant grant;
  grant.gpus = requested_gpus(resource, ids);
  // A GPU left whole (outside the config's devices) is given whole; a slice, its share.
  const bool whole = std::all_of(ids.begin(), ids.end(), [&](const std::string& id) {
    return resource.find(id)->replica < 0;
  });
  for (const int gpu : grant.gpus) {
    const GpuInfo& info = inventory.gpus[static_cast<std::size_t>(gpu)];
    grant.memory_bytes.push_back(whole ? kUnlimited
                                 : resource.memory_per_slice != 0
                                     ? resource.memory_per_slice
                                     : info.memory_bytes /
                                           static_cast<std::uint64_t>(resource.replicas));
    grant.cores.push_back(whole ? 0 : resource.cores_per_slice);
  }
  grant.source = whole ? "a whole GPU of the slices' resource" : "the slice's defaults";
  return grant;
}

ContainerGrant gpushare_grant(const Inventory&, const Resource& resource,
                              const std::vector<std::string>& ids) {
  ContainerGrant grant;
  grant.gpus = requested_gpus(resource, ids);
  const std::map<int, int> units = ids_per_gpu(resource, ids);
  for (const int gpu : grant.gpus) {
    grant.memory_bytes.push_back(static_cast<std::uint64_t>(units.at(gpu)) *
                                 contract::kGpushareUnitBytes);
    grant.cores.push_back(0);
  }
  grant.source = fmt::format("{} GiB of gpushare's memory units", ids.size());
  return grant;
}

ContainerGrant pod_grant(const Inventory& inventory, const std::vector<int>& gpus,
                         const kube::PodRequest& pod, const kube::PodRequest::Container& container,
                         int assigned_milli) {
  ContainerGrant grant;
  grant.gpus = gpus;
  grant.priority = kube::container_priority(pod, container);
  grant.burst = pod.burst;
  // A GPU count alone asks for whole GPUs; memory or cores ask for part of each.
  const bool whole = container.gpumem_mib == 0 && container.gpumem_percent == 0 &&
                     container.gpucores == 0 && container.gpushare_gib == 0;
  for (const int gpu : gpus) {
    const std::uint64_t total = inventory.gpus[static_cast<std::size_t>(gpu)].memory_bytes;
    std::uint64_t memory = kUnlimited;
    if (container.gpushare_gib > 0) {
      memory = static_cast<std::uint64_t>(container.gpushare_gib) * contract::kGpushareUnitBytes;
    } else if (!whole) {
      if (container.gpumem_mib > 0) {
        memory = static_cast<std::uint64_t>(container.gpumem_mib) << 20;
      } else if (container.gpumem_percent > 0) {
        memory = total / 100 * static_cast<std::uint64_t>(container.gpumem_percent);
      } else if (assigned_milli > 0) {
        memory = total / 1000 * static_cast<std::uint64_t>(assigned_milli);
      }
    }
    grant.memory_bytes.push_back(std::min(memory, total));
    grant.cores.push_back(whole ? 0 : container.gpucores);
  }
  grant.source =
      fmt::format("pod {}/{} (container {})", pod.namespace_name, pod.name, container.name);
  return grant;
}

std::vector<int> assigned_gpus(const Inventory& inventory, const kube::RecordedAssignment& record,
                               const std::vector<std::string>& numbering, int offset, int count) {
  std::vector<int> gpus;
  for (int k = offset; k < offset + count; ++k) {
    if (k < 0 || static_cast<std::size_t>(k) >= record.gpus.size()) return {};
    std::string uuid;
    if (!record.uuids.empty()) {
      uuid = record.uuids[static_cast<std::size_t>(k)];
    } else if (const int number = record.gpus[static_cast<std::size_t>(k)];
               static_cast<std::size_t>(number) < numbering.size()) {
      uuid = numbering[static_cast<std::size_t>(number)];
    }
    const auto found = std::find_if(inventory.gpus.begin(), inventory.gpus.end(),
                                    [&](const GpuInfo& gpu) { return gpu.uuid == uuid; });
    if (uuid.empty() || found == inventory.gpus.end()) return {};
    gpus.push_back(static_cast<int>(found->index));
  }
  return gpus;
}

std::vector<AssignedPlace> assigned_places(const Resource& resource, const kube::PodRequest& pod) {
  std::vector<AssignedPlace> places;
  int offset = 0;
  for (const kube::PodRequest::Container& container : pod.containers) {
    if (resource.kind == ResourceKind::gpushare) {
      places.push_back({container.gpushare_gib, 0, container.gpushare_gib > 0 ? 1 : 0});
    } else {
      places.push_back({container.gpus, offset, container.gpus});
      offset += container.gpus;
    }
  }
  return places;
}

// --- the agent's side -------------------------------------------------------------------------

ContainerGrants::ContainerGrants(contract::StateLayout layout, const kube::Cluster* cluster,
                                 std::string node_name, std::unique_ptr<PodResourcesClient> kubelet,
                                 base::Reporter report)
    : layout_(std::move(layout)),
      cluster_(cluster),
      node_name_(std::move(node_name)),
      kubelet_(std::move(kubelet)),
      report_(std::move(report)) {}

void ContainerGrants::prepare(const Inventory& inventory) {
  std::error_code error;
  for (const std::string& directory : {layout_.containers(), layout_.coordination_directory(),
                                       fs::path(layout_.preload_file()).parent_path().string()}) {
    fs::create_directories(directory, error);
    if (error) {
      throw std::runtime_error(fmt::format("cannot create {}: {}", directory, error.message()));
    }
  }
  // Readable by every container's processes (the files in it are readable and writable).
  fs::permissions(layout_.coordination_directory(),
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                      fs::perms::others_read | fs::perms::others_exec,
                  error);
  std::ofstream preload(layout_.preload_file(), std::ios::trunc);
  preload << contract::kContainerHookPath << "\n";
  if (!preload.flush()) {
    throw std::runtime_error(fmt::format("cannot write {}", layout_.preload_file()));
  }
  // Allocation order continues from the containers this node has already.
  std::uint64_t newest = 0;
  for (const auto& entry : fs::directory_iterator(layout_.containers(), error)) {
    contract::OwnerRecord record;
    if (contract::read_owner_record(layout_.owner_record(entry.path().filename().string()), record)
            .ok()) {
      newest = std::max(newest, record.sequence);
    }
  }
  sequence_ = newest;
  repair_coordination(inventory);
}

int ContainerGrants::repair_coordination(const Inventory& inventory) {
  int repaired = 0;
  auto check = [&](const std::string& uuid) {
    contract::DeviceKey key;
    if (!contract::device_key_from_uuid(uuid.c_str(), key)) return;
    const std::string path = layout_.coordination_file(key);
    bool remade = false;
    ErrorText error;
    if (!ledger::prepare_coordination_file(path.c_str(), key, remade, error)) {
      report_(fmt::format("coordination file of {}: {}", uuid, error.text));
    } else if (remade) {
      ++repaired;
      report_(fmt::format("{} (device {}) was written over: made whole again", path, uuid));
    }
  };
  for (const GpuInfo& gpu : inventory.gpus) {
    check(gpu.uuid);
    for (const MigDeviceInfo& device : gpu.mig_devices) check(device.uuid);
  }
  return repaired;
}

bool ContainerGrants::limits_at_pre_start(const Resource& resource) const {
  return limited_kind(resource.kind) && cluster_ != nullptr;
}

ContainerGrants::Made ContainerGrants::make_container(ContainerAllocation& allocation,
                                                      const Inventory& inventory,
                                                      const std::string& resource,
                                                      const std::vector<std::string>& ids,
                                                      const std::vector<int>& gpus,
                                                      const ContainerGrant* grant, std::string id) {
  Made made;
  made.id = id.empty() ? random_uuid() : std::move(id);
  std::error_code error;
  const std::string group = layout_.group_directory(made.id);
  fs::create_directories(fs::path(group) / contract::kCoordinationDirectoryName, error);
  if (error) {
    throw AllocationError(fmt::format("cannot create {}: {}", group, error.message()));
  }
  chmod(group.c_str(), 0755);
  allocation.mounts.push_back({contract::kContainerHookPath, layout_.hook_library(), true});
  allocation.mounts.push_back({contract::kContainerPreloadPath, layout_.preload_file(), true});
  allocation.mounts.push_back({contract::kContainerGroupDirectory, group, false});
  // Each device's coordination file, under the device's key whatever ordinal the container
  // sees it as. The mount points exist before the container does.
  for (const int gpu : gpus) {
    contract::DeviceKey key;
    const std::string& uuid = inventory.gpus[static_cast<std::size_t>(gpu)].uuid;
    if (!contract::device_key_from_uuid(uuid.c_str(), key)) {
      report_(
          fmt::format("GPU {} ({}) has no key for a coordination file; its containers are "
                      "not coordinated with each other",
                      gpu, uuid));
      continue;
    }
    std::ofstream(layout_.coordination_mount_point(made.id, key));
    allocation.mounts.push_back(
        {contract::container_coordination_file(key), layout_.coordination_file(key), false});
  }
  allocation.envs[contract::kLedgerVariable] = contract::kContainerLedgerPath;
  allocation.envs[contract::kHamiSharedCacheVariable] = contract::kContainerLedgerPath;
  made.record.resource = resource;
  made.record.device_ids = ids;
  std::sort(made.record.device_ids.begin(), made.record.device_ids.end());
  made.record.gpus = gpus;
  made.record.sequence = ++sequence_;
  if (grant != nullptr) {
    write_ledger(made.id, made.record, *grant);
    made.record.limits_written = true;
    for (auto& [name, value] : contract::limit_variables(grant->memory_bytes, grant->cores)) {
      allocation.envs[name] = value;
    }
  }
  if (const base::Status written =
          contract::write_owner_record(layout_.owner_record(made.id), made.record);
      !written.ok()) {
    throw AllocationError(written.message());
  }
  return made;
}

void ContainerGrants::write_ledger(const std::string& id, const contract::OwnerRecord& record,
                                   const ContainerGrant& grant) const {
  ledger::GroupSpec spec;
  const std::string name =
      (record.pod_name.empty() ? id : record.pod_name + "/" + record.container).substr(0, 63);
  spec.name = name.c_str();
  spec.priority = grant.priority;
  spec.burst = grant.burst;
  for (std::size_t i = 0; i < grant.gpus.size() && i < static_cast<std::size_t>(kMostDevices);
       ++i) {
    spec.limits.memory_bytes[i] = grant.memory_bytes[i];
    spec.limits.core_percent[i] = static_cast<std::uint32_t>(grant.cores[i]);
  }
  const std::string path = layout_.ledger(id);
  ledger::Ledger ledger;
  ErrorText refused;
  if (!ledger.create_or_open(path.c_str(), spec, refused)) {
    throw AllocationError(fmt::format("cannot write the container's ledger: {}", refused.text));
  }
  chmod(path.c_str(), 0666);  // the container's processes, whatever their user, account in it
}

ContainerAllocation ContainerGrants::allocate(const Inventory& inventory,
                                              const PluginConfig& config, const Resource& resource,
                                              const std::vector<std::string>& ids,
                                              const HealthBoard& health) {
  const std::vector<int> gpus = requested_gpus(resource, ids);  // checks the IDs
  for (const int gpu : gpus) {
    if (!health.healthy(gpu)) {
      throw AllocationError(
          fmt::format("GPU {} for {} is unhealthy ({})", gpu, resource.name, health.reason(gpu)));
    }
  }
  ContainerAllocation allocation = expose_gpus(inventory, config, gpus, random_uuid());
  if (resource.kind == ResourceKind::gpushare) {
    // gpushare's variables, as its device plugin gives them: the GPU's index, the GiB asked in
    // this request (its "pod" count is the same sum), and the GPU's memory in GiB.
    const GpuInfo& gpu = inventory.gpus[static_cast<std::size_t>(gpus.front())];
    allocation.envs[contract::kGpushareIndexVariable] = std::to_string(gpu.index);
    allocation.envs[contract::kGpushareContainerVariable] = std::to_string(ids.size());
    allocation.envs[contract::kGpusharePodVariable] = std::to_string(ids.size());
    allocation.envs[contract::kGpushareDeviceVariable] =
        std::to_string(gpu.memory_bytes / contract::kGpushareUnitBytes);
  }
  std::optional<ContainerGrant> grant;
  if (!limits_at_pre_start(resource)) {
    grant = resource.kind == ResourceKind::gpushare ? gpushare_grant(inventory, resource, ids)
                                                    : default_grant(inventory, resource, ids);
  }
  const Made made =
      make_container(allocation, inventory, resource.name, ids, gpus, grant ? &*grant : nullptr);
  if (grant) {
    report_(fmt::format("{}: {} on GPU(s) {}: memory {}, cores {} ({})", resource.name,
                        id_list(ids), fmt::join(grant->gpus, ","),
                        fmt::join(grant->memory_bytes, ","), fmt::join(grant->cores, ","),
                        grant->source));
  } else {
    report_(fmt::format("{}: {} on GPU(s) {}: container {}; its limits come at PreStartContainer",
                        resource.name, id_list(ids), fmt::join(gpus, ","), made.id));
  }
  return allocation;
}

std::string ContainerGrants::find_container(const std::string& resource,
                                            std::vector<std::string> ids,
                                            contract::OwnerRecord& record) const {
  std::sort(ids.begin(), ids.end());
  std::string newest;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(layout_.containers(), error)) {
    contract::OwnerRecord found;
    if (!contract::read_owner_record(layout_.owner_record(entry.path().filename().string()), found)
             .ok() ||
        found.resource != resource || found.device_ids != ids) {
      continue;
    }
    if (newest.empty() || found.sequence > record.sequence) {
      newest = entry.path().filename().string();
      record = found;
    }
  }
  return newest;
}

void ContainerGrants::pre_start(const Inventory& inventory, const Resource& resource,
                                const std::vector<std::string>& ids,
                                const std::vector<std::string>& numbering) {
  if (!limits_at_pre_start(resource)) return;
  contract::OwnerRecord record;
  const std::string id = find_container(resource.name, ids, record);
  if (id.empty()) {
    throw AllocationError(fmt::format("{} {}: this node agent allocated no such container",
                                      resource.name, id_list(ids)));
  }
  if (record.limits_written) return;  // the container starts again: its ledger holds
  if (kubelet_ == nullptr) {
    throw AllocationError(
        fmt::format("{} {}: whose they are needs the kubelet's pod-resources API "
                    "(tessera node --pod-resources-socket)",
                    resource.name, id_list(ids)));
  }
  DeviceHolder holder;
  if (const base::Status asked = kubelet_->holder_of(resource.name, ids, holder); !asked.ok()) {
    throw AllocationError(fmt::format("{}; its limits cannot be known", asked.message()));
  }
  const std::string label = holder.pod_namespace + "/" + holder.pod_name;
  const kube::Deadline deadline = std::chrono::steady_clock::now() + kCallBudget;
  const kube::ApiResponse read =
      cluster_->get_pod({holder.pod_namespace, holder.pod_name}, deadline);
  if (read.status != 200) {
    throw AllocationError(
        fmt::format("pod {} cannot be read (HTTP {} {}); its limits cannot be "
                    "known",
                    label, read.status, read.error));
  }
  nlohmann::json object;
  kube::PodRequest pod;
  try {
    object = kube::parse_outside_json(read.body);
    pod = kube::pod_from_json(object);
  } catch (const std::exception& failure) {
    throw AllocationError(fmt::format("pod {}: {}", label, failure.what()));
  }
  const auto container = std::find_if(
      pod.containers.begin(), pod.containers.end(),
      [&](const kube::PodRequest::Container& c) { return c.name == holder.container; });
  if (container == pod.containers.end()) {
    throw AllocationError(fmt::format("pod {} has no container {}", label, holder.container));
  }
  const std::optional<kube::RecordedAssignment> assignment = assignment_here(object, node_name_);
  const ContainerGrant grant =
      pod_grant(inventory, record.gpus, pod, *container, assignment ? assignment->milli : 0);
  record.pod_namespace = pod.namespace_name;
  record.pod_name = pod.name;
  record.pod_uid = pod.uid;
  record.container = holder.container;
  write_ledger(id, record, grant);
  record.limits_written = true;
  if (const base::Status written = contract::write_owner_record(layout_.owner_record(id), record);
      !written.ok()) {
    throw AllocationError(written.message());
  }
  report_(fmt::format("{}: {} on GPU(s) {}: memory {}, cores {}{}, priority {} ({})", resource.name,
                      id_list(ids), fmt::join(grant.gpus, ","), fmt::join(grant.memory_bytes, ","),
                      fmt::join(grant.cores, ","), grant.burst ? " (bursting)" : "",
                      priority_name(grant.priority), grant.source));
  if (assignment) {
    const AssignedPlace place = assigned_places(
        resource, pod)[static_cast<std::size_t>(container - pod.containers.begin())];
    const std::vector<int> assigned =
        assigned_gpus(inventory, *assignment, numbering, place.offset, place.count);
    if (!assigned.empty() && assigned != record.gpus) {
      rewrite_assignment(object, *assignment, place.offset, record.gpus, numbering, inventory);
    }
  }
}

void ContainerGrants::rewrite_assignment(const nlohmann::json& pod,
                                         const kube::RecordedAssignment& record, int offset,
                                         const std::vector<int>& gpus,
                                         const std::vector<std::string>& numbering,
                                         const Inventory& inventory) const {
  const std::string name_space = string_at(pod, "/metadata/namespace"_json_pointer);
  const std::string name = string_at(pod, "/metadata/name"_json_pointer);
  kube::RecordedAssignment corrected = record;
  for (std::size_t k = 0; k < gpus.size(); ++k) {
    const std::string& uuid = inventory.gpus[static_cast<std::size_t>(gpus[k])].uuid;
    const auto number = std::find(numbering.begin(), numbering.end(), uuid);
    const std::size_t at = static_cast<std::size_t>(offset) + k;
    if (number == numbering.end() || at >= corrected.gpus.size()) return;
    corrected.gpus[at] = static_cast<int>(number - numbering.begin());
    if (!corrected.uuids.empty()) corrected.uuids[at] = uuid;
  }
  nlohmann::json patch{
      {"metadata",
       {{"annotations",
         {{contract::kAssignmentAnnotation, kube::assignment_annotation(corrected)}}},
        {"resourceVersion", string_at(pod, "/metadata/resourceVersion"_json_pointer)}}}};
  const kube::ApiResponse answer = cluster_->patch_pod(
      {name_space, name}, patch, std::chrono::steady_clock::now() + kCallBudget);
  ++rewritten_;
  report_(fmt::format(
      "pod {}/{}: the kubelet gave it GPU(s) {} where the scheduler assigned others; its "
      "assignment now says so{}",
      name_space, name, fmt::join(gpus, ","),
      answer.status == 200
          ? ""
          : fmt::format(" (not written: HTTP {} {})", answer.status, answer.error)));
}

std::vector<std::string> ContainerGrants::prefer(
    const Inventory& inventory, const Resource& resource, const std::vector<std::string>& available,
    const std::vector<std::string>& must_include, int size,
    const std::vector<std::string>& numbering,
    const std::function<std::vector<std::string>()>& fallback) const {
  if (!limits_at_pre_start(resource) || kubelet_ == nullptr) return fallback();
  // The containers being admitted: known to the kubelet, asking for `size` of the resource,
  // holding none of it yet. A kubelet admits pods one at a time, so there is one.
  std::vector<KubeletPod> kubelet_pods;
  if (!kubelet_->list(kubelet_pods).ok()) return fallback();
  const kube::ApiResponse listed = cluster_->list(kube::Collection::pods_on_node(node_name_),
                                                  std::chrono::steady_clock::now() + kCallBudget);
  if (listed.status != 200) return fallback();
  std::vector<std::vector<int>> wanted;
  try {
    const nlohmann::json body = kube::parse_outside_json(listed.body);
    const nlohmann::json* items = kube::find_at(body, {"items"});
    for (const nlohmann::json& item :
         items != nullptr && items->is_array() ? *items : nlohmann::json()) {
      if (kube::pod_finished(item) || kube::find_at(item, {"metadata", "deletionTimestamp"}))
        continue;  // not being admitted
      const std::optional<kube::RecordedAssignment> assignment = assignment_here(item, node_name_);
      if (!assignment) continue;
      kube::PodRequest pod;
      try {
        pod = kube::pod_from_json(item);
      } catch (const std::exception&) {
        continue;
      }
      const auto known = std::find_if(kubelet_pods.begin(), kubelet_pods.end(), [&](const auto& k) {
        return k.name_space == pod.namespace_name && k.name == pod.name;
      });
      if (known == kubelet_pods.end()) continue;
      const std::vector<AssignedPlace> places = assigned_places(resource, pod);
      for (std::size_t c = 0; c < pod.containers.size(); ++c) {
        if (places[c].asks == 0 || places[c].asks != size) continue;
        const auto held = std::find_if(
            known->containers.begin(), known->containers.end(), [&](const KubeletContainer& k) {
              return k.name == pod.containers[c].name && k.devices.contains(resource.name);
            });
        if (held != known->containers.end()) continue;
        std::vector<int> gpus =
            assigned_gpus(inventory, *assignment, numbering, places[c].offset, places[c].count);
        if (!gpus.empty()) wanted.push_back(std::move(gpus));
      }
    }
  } catch (const std::exception&) {
    return fallback();
  }
  if (wanted.empty() || std::any_of(wanted.begin(), wanted.end(),
                                    [&](const auto& gpus) { return gpus != wanted[0]; }))
    return fallback();  // none to be told, or several admitted at once that want different GPUs
  std::vector<std::string> chosen = must_include;
  for (const int gpu : wanted[0]) {
    int needed = resource.kind == ResourceKind::gpushare
                     ? size - static_cast<int>(chosen.size())
                     : 1 - static_cast<int>(std::count_if(
                               chosen.begin(), chosen.end(), [&](const std::string& id) {
                                 const AdvertisedDevice* d = resource.find(id);
                                 return d != nullptr && d->gpu == gpu;
                               }));
    for (const std::string& id : available) {
      if (needed <= 0) break;
      const AdvertisedDevice* device = resource.find(id);
      if (device == nullptr || device->gpu != gpu ||
          std::find(chosen.begin(), chosen.end(), id) != chosen.end()) {
        continue;
      }
      chosen.push_back(id);
      --needed;
    }
  }
  if (static_cast<int>(chosen.size()) != size) return fallback();
  return chosen;
}

std::string ContainerGrants::add_ledger(ContainerAllocation& allocation, const Inventory& inventory,
                                        const Resource& resource,
                                        const std::vector<std::string>& ids,
                                        const ContainerGrant& grant) {
  make_container(allocation, inventory, resource.name, ids, grant.gpus, &grant);
  return fmt::format("memory {}", fmt::join(grant.memory_bytes, ","));
}

std::string claim_container_id(const std::string& claim_uid) {
  return "claim-" + claim_uid;
}

void ContainerGrants::claim_container(ContainerAllocation& allocation, const Inventory& inventory,
                                      const std::string& claim_uid,
                                      const std::vector<std::string>& devices,
                                      const ContainerGrant& grant) {
  const std::string id = claim_container_id(claim_uid);
  // A ledger left by an attempt that failed after it was written may hold other limits.
  if (const base::Status removed = remove_claim_container(claim_uid); !removed.ok()) {
    throw AllocationError(removed.message());
  }
  make_container(allocation, inventory, contract::kDraDriverName, devices, grant.gpus, &grant, id);
}

base::Status ContainerGrants::remove_claim_container(const std::string& claim_uid) {
  std::error_code error;
  const std::string directory = layout_.container(claim_container_id(claim_uid));
  fs::remove_all(directory, error);
  if (error) {
    return base::Status::failure(fmt::format("cannot remove {}: {}", directory, error.message()));
  }
  return base::Status::success();
}

int ContainerGrants::collect(const std::set<std::string>& live_pod_uids) {
  int removed = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(layout_.containers(), error)) {
    const std::string id = entry.path().filename().string();
    contract::OwnerRecord record;
    const bool readable = contract::read_owner_record(layout_.owner_record(id), record).ok();
    if (readable && !record.pod_uid.empty() && live_pod_uids.contains(record.pod_uid)) continue;
    if (readable && record.resource == contract::kDraDriverName) continue;
    // A container not yet known by its pod may still be starting (an image pull takes minutes):
    // it stays a day.
    std::error_code age_error;
    const auto written = fs::last_write_time(layout_.owner_record(id), age_error);
    if ((!readable || record.pod_uid.empty()) &&
        (age_error || fs::file_time_type::clock::now() - written < kUnstartedKept)) {
      continue;
    }
    ledger::Ledger ledger;
    ErrorText ignored;
    if (ledger.open(layout_.ledger(id).c_str(), ignored) && ledger.live_members() != 0) continue;
    ledger.close();
    std::error_code removal;
    fs::remove_all(entry.path(), removal);
    removed += !removal;
  }
  return removed;
}

}  // namespace tessera::node
