#include "node/slices.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/limits.h"
#include "kube/json_input.h"
#include "kube/objects.h"
#include "ledger/ledger.h"

namespace tessera::node {
namespace {

namespace fs = std::filesystem;
using kube::string_at;

constexpr int kClaimAttempts = 5;
// All the API calls of one claim together: the kubelet waits on Allocate meanwhile, and a
// container that cannot learn its pod's request gets the slice's defaults rather than hang.
constexpr auto kClaimBudget = std::chrono::seconds(8);

// The scheduler's numbering of this node's GPUs: those served whole or as slices, in the
// inventory's order, as the tessera.io/gpus annotation lists them.
std::vector<int> scheduler_numbering(const Inventory& inventory, const ResourceMap* map,
                                     const Resource& resource) {
  std::vector<int> gpus;
  for (const GpuInfo& gpu : inventory.gpus) {
    const int index = static_cast<int>(gpu.index);
    bool counted = false;
    auto consider = [&](const Resource& candidate) {
      for (const AdvertisedDevice& device : candidate.devices) {
        if (device.gpu == index && (candidate.kind == ResourceKind::slices || device.replica < 0)) {
          counted = true;
        }
      }
    };
    if (map != nullptr) {
      for (const Resource& candidate : map->resources) consider(candidate);
    } else {
      consider(resource);
    }
    if (counted) gpus.push_back(index);
  }
  return gpus;
}

std::string joined(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ",") + item;
  return text;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

}  // namespace

SliceAllocator::SliceAllocator(const kube::ApiClient* api, std::string node_name, SliceFiles files,
                               Reporter report)
    : api_(api),
      node_name_(std::move(node_name)),
      files_(std::move(files)),
      report_(std::move(report)) {}

void SliceAllocator::prepare() const {
  std::error_code error;
  fs::create_directories(files_.ledger_root, error);
  if (error) {
    throw std::runtime_error(
        fmt::format("cannot create {}: {}", files_.ledger_root, error.message()));
  }
  fs::create_directories(fs::path(files_.preload_file).parent_path(), error);
  std::ofstream preload(files_.preload_file, std::ios::trunc);
  preload << kContainerHookPath << "\n";
  if (!preload) throw std::runtime_error(fmt::format("cannot write {}", files_.preload_file));
}

SliceGrant SliceAllocator::defaults(const Inventory& inventory, const Resource& resource,
                                    const std::vector<std::string>& ids) const {
  SliceGrant grant;
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

bool SliceAllocator::claim_pod(const Inventory& inventory, const Resource& resource, int devices,
                               SliceGrant& grant) {
  const std::string path = "/api/v1/pods?fieldSelector=spec.nodeName%3D" + node_name_;
  const kube::Deadline deadline = std::chrono::steady_clock::now() + kClaimBudget;
  for (int attempt = 0; attempt < kClaimAttempts; ++attempt) {
    const kube::ApiResponse listed = api_->get(path, deadline);
    if (listed.status != 200) {
      report_(
          fmt::format("slices: cannot list this node's pods (HTTP {} {}); the slice's "
                      "defaults apply",
                      listed.status, listed.error));
      return false;
    }
    struct Candidate {
      std::string created, label, path, version, uid, container, allocated;
      int offset = 0;
      kube::PodRequest pod;
      kube::RecordedAssignment assignment;
    };
    std::vector<Candidate> candidates;
    nlohmann::json body;
    try {
      body = kube::parse_outside_json(listed.body);
    } catch (const std::exception& failure) {
      report_(fmt::format("slices: the API server's pod list cannot be read: {}", failure.what()));
      return false;
    }
    const nlohmann::json* items = kube::find_at(body, {"items"});
    if (items == nullptr || !items->is_array()) return false;
    for (const nlohmann::json& item : *items) {
      const std::string phase = string_at(item, "/status/phase"_json_pointer);
      if (!phase.empty() && phase != "Pending") continue;
      if (kube::find_at(item, {"metadata", "deletionTimestamp"}) != nullptr) continue;
      const nlohmann::json* record =
          kube::find_at(item, {"metadata", "annotations", kube::kAssignmentAnnotation});
      if (record == nullptr) continue;
      Candidate candidate;
      try {
        candidate.assignment = kube::assignment_from_annotation(*record);
        candidate.pod = kube::pod_from_json(item);
      } catch (const std::exception& failure) {
        report_(fmt::format("slices: a pod on this node cannot be read: {}", failure.what()));
        continue;
      }
      if (candidate.assignment.node != node_name_) continue;
      candidate.uid = candidate.pod.uid;
      candidate.label = candidate.pod.namespace_name + "/" + candidate.pod.name;
      candidate.path = fmt::format("/api/v1/namespaces/{}/pods/{}", candidate.pod.namespace_name,
                                   candidate.pod.name);
      candidate.version = string_at(item, "/metadata/resourceVersion"_json_pointer);
      candidate.created = string_at(item, "/metadata/creationTimestamp"_json_pointer);
      candidate.allocated = string_at(
          item, nlohmann::json::json_pointer("/metadata/annotations/tessera.io~1allocated"));
      const std::vector<std::string> done = split(candidate.allocated);
      // Its first container that asks for this many devices and has no slice yet; GPUs are
      // handed to containers in the pod's order.
      int offset = 0;
      for (const auto& container : candidate.pod.containers) {
        const bool taken = std::find(done.begin(), done.end(), container.name) != done.end() ||
                           claimed_.count(candidate.uid + "/" + container.name) > 0;
        if (container.gpus == devices && !taken) {
          candidate.container = container.name;
          candidate.offset = offset;
          break;
        }
        offset += container.gpus;
      }
      if (!candidate.container.empty()) candidates.push_back(std::move(candidate));
    }
    if (candidates.empty()) return false;
    const auto first = std::min_element(
        candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
          return std::tie(a.created, a.label) < std::tie(b.created, b.label);
        });
    Candidate& chosen = *first;
    // Claimed on the version read: a pod changed since (another claim) is read again.
    const std::string allocated =
        chosen.allocated.empty() ? chosen.container : chosen.allocated + "," + chosen.container;
    nlohmann::json patch{{"metadata", {{"annotations", {{kAllocatedAnnotation, allocated}}}}}};
    if (!chosen.version.empty()) patch["metadata"]["resourceVersion"] = chosen.version;
    const kube::ApiResponse claimed =
        api_->patch(chosen.path, kube::dump_outside_json(patch), deadline);
    if (claimed.status == 409) continue;
    if (claimed.status != 200) {
      report_(
          fmt::format("slices: pod {}: the claim could not be recorded (HTTP {} {}); this agent "
                      "remembers it",
                      chosen.label, claimed.status, claimed.error));
    }
    claimed_.insert(chosen.uid + "/" + chosen.container);

    // The assignment's GPUs for this container, in the scheduler's numbering or by UUID.
    const std::vector<int> numbering = scheduler_numbering(inventory, nullptr, resource);
    grant = SliceGrant{};
    grant.pod_namespace = chosen.pod.namespace_name;
    grant.pod_name = chosen.pod.name;
    grant.pod_uid = chosen.uid;
    grant.container = chosen.container;
    grant.source =
        fmt::format("the assignment of pod {} (container {})", chosen.label, chosen.container);
    for (int k = chosen.offset; k < chosen.offset + devices; ++k) {
      if (static_cast<std::size_t>(k) >= chosen.assignment.gpus.size()) {
        throw AllocationError(
            fmt::format("pod {}: its assignment names {} GPU(s); container {} "
                        "needs {} from the {}th",
                        chosen.label, chosen.assignment.gpus.size(), chosen.container, devices,
                        chosen.offset + 1));
      }
      int gpu = -1;
      if (!chosen.assignment.uuids.empty()) {
        for (const GpuInfo& info : inventory.gpus) {
          if (info.uuid == chosen.assignment.uuids[static_cast<std::size_t>(k)])
            gpu = static_cast<int>(info.index);
        }
      } else if (const int number = chosen.assignment.gpus[static_cast<std::size_t>(k)];
                 static_cast<std::size_t>(number) < numbering.size()) {
        gpu = numbering[static_cast<std::size_t>(number)];
      }
      if (gpu < 0) {
        throw AllocationError(
            fmt::format("pod {}: its assignment names a GPU this node does not "
                        "serve ({})",
                        chosen.label, kube::assignment_annotation(chosen.assignment)));
      }
      grant.gpus.push_back(gpu);
    }
    // A GPU count alone asks for whole GPUs; memory or cores ask for part of each.
    const kube::PodRequest& pod = chosen.pod;
    const bool whole = pod.gpumem_mib == 0 && pod.gpumem_percent == 0 && pod.gpucores == 0;
    for (const int gpu : grant.gpus) {
      const std::uint64_t total = inventory.gpus[static_cast<std::size_t>(gpu)].memory_bytes;
      std::uint64_t memory = kUnlimited;
      if (!whole) {
        if (pod.gpumem_mib > 0) {
          memory = static_cast<std::uint64_t>(pod.gpumem_mib) << 20;
        } else if (pod.gpumem_percent > 0) {
          memory = total / 100 * static_cast<std::uint64_t>(pod.gpumem_percent);
        } else if (chosen.assignment.milli > 0) {
          memory = total / 1000 * static_cast<std::uint64_t>(chosen.assignment.milli);
        }
      }
      grant.memory_bytes.push_back(memory);
      grant.cores.push_back(whole ? 0 : pod.gpucores);
    }
    return true;
  }
  report_(
      "slices: the pods on this node kept changing while a slice was claimed; the slice's "
      "defaults apply");
  return false;
}

SliceGrant SliceAllocator::grant_for(const Inventory& inventory, const Resource& resource,
                                     const std::vector<std::string>& ids) {
  requested_gpus(resource, ids);  // checks the IDs before anything is claimed
  std::lock_guard<std::mutex> locked(claim_mutex_);
  SliceGrant grant;
  if (api_ != nullptr && claim_pod(inventory, resource, static_cast<int>(ids.size()), grant)) {
    return grant;
  }
  return defaults(inventory, resource, ids);
}

std::string SliceAllocator::make_ledger(const SliceGrant& grant) const {
  const std::string name =
      grant.pod_uid.empty() ? "default-" + random_uuid() : grant.pod_uid + "_" + grant.container;
  if (name.find('/') != std::string::npos || name.find("..") != std::string::npos ||
      name.size() > 200) {
    throw AllocationError(fmt::format("a ledger cannot be named for {}", name.substr(0, 100)));
  }
  const std::string directory = files_.ledger_root + "/" + name;
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) {
    throw AllocationError(fmt::format("cannot create {}: {}", directory, error.message()));
  }
  chmod(directory.c_str(), 0755);
  ledger::GroupSpec spec;
  const std::string group =
      grant.pod_name.empty() ? name.substr(0, 63)
                             : fmt::format("{}/{}", grant.pod_name, grant.container).substr(0, 63);
  spec.name = group.c_str();
  for (std::size_t i = 0; i < grant.gpus.size() && i < static_cast<std::size_t>(kMaxDevices); ++i) {
    spec.limits.memory_bytes[i] = grant.memory_bytes[i];
    spec.limits.core_percent[i] = static_cast<std::uint32_t>(grant.cores[i]);
  }
  const std::string path = directory + "/group.ledger";
  ledger::Ledger ledger;
  ErrorText refused;
  if (!ledger.create_or_open(path.c_str(), spec, refused)) {
    throw AllocationError(fmt::format("cannot create the container's ledger: {}", refused.text));
  }
  chmod(path.c_str(), 0666);  // the container's processes, whatever their user, account in it
  nlohmann::json owner{{"namespace", grant.pod_namespace},
                       {"pod", grant.pod_name},
                       {"uid", grant.pod_uid},
                       {"container", grant.container},
                       {"gpus", grant.gpus}};
  std::ofstream(directory + "/owner.json") << kube::dump_outside_json(owner) << "\n";
  return directory;
}

ContainerAllocation SliceAllocator::allocate(const Inventory& inventory, const PluginConfig& config,
                                             const Resource& resource,
                                             const std::vector<std::string>& ids,
                                             const HealthBoard& health) {
  const SliceGrant grant = grant_for(inventory, resource, ids);
  for (const int gpu : grant.gpus) {
    if (!health.healthy(gpu)) {
      throw AllocationError(
          fmt::format("GPU {} for {} is unhealthy ({})", gpu, grant.source, health.reason(gpu)));
    }
  }
  ContainerAllocation allocation = expose_gpus(inventory, config, grant.gpus, random_uuid());
  const std::string limits = add_ledger(allocation, grant);
  report_(fmt::format("slices: {} on GPU(s) {}: {} ({})", joined(ids),
                      fmt::format("{}", fmt::join(grant.gpus, ",")), limits, grant.source));
  return allocation;
}

std::string SliceAllocator::add_ledger(ContainerAllocation& allocation,
                                       const SliceGrant& grant) const {
  const std::string directory = make_ledger(grant);
  std::vector<std::string> memory, cores;
  for (std::size_t i = 0; i < grant.gpus.size(); ++i) {
    if (grant.memory_bytes[i] != kUnlimited) {
      memory.push_back(fmt::format("{}={}", i, grant.memory_bytes[i]));
      allocation.envs[fmt::format("CUDA_DEVICE_MEMORY_LIMIT_{}", i)] =
          fmt::format("{}m", grant.memory_bytes[i] >> 20);
    }
    if (grant.cores[i] > 0) {
      cores.push_back(fmt::format("{}={}", i, grant.cores[i]));
      allocation.envs[fmt::format("CUDA_DEVICE_SM_LIMIT_{}", i)] = std::to_string(grant.cores[i]);
    }
  }
  if (!memory.empty()) allocation.envs["TESSERA_MEMORY_LIMIT"] = joined(memory);
  if (!cores.empty()) allocation.envs["TESSERA_CORE_LIMIT"] = joined(cores);
  allocation.envs["TESSERA_LEDGER"] = kContainerLedgerFile;
  allocation.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = kContainerLedgerFile;
  allocation.mounts.push_back({kContainerHookPath, files_.hook_library, true});
  allocation.mounts.push_back({"/etc/ld.so.preload", files_.preload_file, true});
  allocation.mounts.push_back({kContainerLedgerDir, directory, false});
  return fmt::format("memory {}, cores {}", memory.empty() ? "unlimited" : joined(memory),
                     cores.empty() ? "uncapped" : joined(cores));
}

int SliceAllocator::collect(const std::set<std::string>& live_pod_uids) {
  {
    std::lock_guard<std::mutex> locked(claim_mutex_);
    std::erase_if(claimed_, [&](const std::string& claim) {
      return live_pod_uids.count(claim.substr(0, claim.find('/'))) == 0;
    });
  }
  int removed = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(files_.ledger_root, error)) {
    const std::string name = entry.path().filename().string();
    const std::string uid = name.substr(0, name.find('_'));
    if (live_pod_uids.count(uid) > 0) continue;
    // A slice given without a pod to name it belongs to a container that may still be
    // starting (an image pull takes minutes): its ledger stays a day.
    std::error_code age_error;
    const auto written = fs::last_write_time(entry.path(), age_error);
    if (name.rfind("default-", 0) == 0 &&
        (age_error || fs::file_time_type::clock::now() - written < std::chrono::hours(24))) {
      continue;
    }
    ledger::Ledger ledger;
    ErrorText ignored;
    const std::string path = entry.path().string() + "/group.ledger";
    if (ledger.open(path.c_str(), ignored) && ledger.live_members() != 0) continue;
    ledger.close();
    std::error_code removal;
    fs::remove_all(entry.path(), removal);
    removed += !removal;
  }
  return removed;
}

}  // namespace tessera::node
