// What a container given part of a GPU gets, and when. Containers of Tessera's slices, of
// gpushare's memory units and of MPS replicas get the hook (/etc/ld.so.preload and the library,
// read-only), a ledger of their own that holds their limits across all their processes, and the
// coordination file of each of their devices, where they meet every other container on the
// device whatever its pod (compute shares, bursting, priority). contract/host_layout.h has the
// layout.
//
// The kubelet's Allocate names only device IDs, never the pod, so a limit written then would be
// a guess. With an API server, Allocate gives the container its devices, the hook and an empty
// ledger directory, and records the IDs (the owner record); the kubelet then records which
// container holds them, and calls PreStartContainer before that container starts. There the
// agent asks the kubelet's pod-resources API whose IDs they are, reads that pod, and writes the
// container's ledger with its own limits and priority. The hook waits for the ledger (bounded)
// and never runs without one. Nothing is locked: every container is matched by its own IDs.
//
// Which GPU a container gets is the kubelet's choice of IDs; GetPreferredAllocation steers it to
// the GPU the scheduler assigned (prefer below). Where it cannot (a kubelet admitting several
// pods at once), the container keeps the GPU it was given and its pod's assignment is rewritten
// to say so, so the scheduler's books follow what the node did.
//
// Without an API server, a slice's defaults from the config are written at Allocate.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/log.h"
#include "common/priority.h"
#include "contract/host_layout.h"
#include "contract/owner_record.h"
#include "kube/cluster.h"
#include "kube/objects.h"
#include "node/allocation.h"
#include "node/config.h"
#include "node/health.h"
#include "node/nvml.h"
#include "node/pod_resources.h"
#include "node/resources.h"

namespace tessera::node {

// What a container gets on each of its GPUs.
struct ContainerGrant {
  std::vector<int> gpus;                    // inventory indices; the container's 0, 1, ...
  std::vector<std::uint64_t> memory_bytes;  // per GPU; kUnlimited for none
  std::vector<int> cores;                   // per GPU; 0 for none
  Priority priority = Priority::none;
  bool burst = false;  // may use device time beyond its cores that no one else wants
  std::string source;  // for the log
};

// --- decisions, without I/O -----------------------------------------------------------------

// A slice's defaults from the config (no pod known): memoryPerSlice (else the GPU's memory over
// its replicas) and coresPerSlice; a GPU left whole (outside the config's devices) none.
ContainerGrant default_grant(const Inventory& inventory, const Resource& resource,
                             const std::vector<std::string>& ids);
// gpushare memory units: a GiB for each, on their GPU.
ContainerGrant gpushare_grant(const Inventory& inventory, const Resource& resource,
                              const std::vector<std::string>& ids);
// A container of a known pod on `gpus`: its nvidia.com/gpumem, else gpumem-percentage of each
// GPU, else the scheduler's share (`assigned_milli`); its nvidia.com/gpucores; whole GPUs for a
// GPU count alone; gpushare's GiB for an aliyun.com/gpu-mem container; its priority.
ContainerGrant pod_grant(const Inventory& inventory, const std::vector<int>& gpus,
                         const kube::PodRequest& pod, const kube::PodRequest::Container& container,
                         int assigned_milli);
// The inventory GPUs a pod's assignment names for `count` GPUs from its `offset`th: by UUID
// where recorded, else by the scheduler's numbering (`numbering`, contract/gpu_numbering.h).
// Empty if any is not on this node.
std::vector<int> assigned_gpus(const Inventory& inventory, const kube::RecordedAssignment& record,
                               const std::vector<std::string>& numbering, int offset, int count);
// A container's ask of a resource, and where its GPUs stand in its pod's assignment.
struct AssignedPlace {
  int asks = 0;    // device IDs of the resource; 0: it asks for none
  int offset = 0;  // its first GPU in the assignment
  int count = 0;   // its GPUs there
};
// Each of the pod's containers' place, in the pod's order: gpushare's pods have one GPU for all
// their containers; slices are handed to containers in the pod's order, a GPU for each.
std::vector<AssignedPlace> assigned_places(const Resource& resource, const kube::PodRequest& pod);

// The container directory of a DRA claim: "claim-<uid>".
std::string claim_container_id(const std::string& claim_uid);

// --- the agent's side -------------------------------------------------------------------------

class ContainerGrants {
 public:
  // `cluster` may be null (no cluster: the defaults always); so may `kubelet` (then a container
  // whose limits need its pod cannot start, and says why).
  ContainerGrants(contract::StateLayout layout, const kube::Cluster* cluster, std::string node_name,
                  std::unique_ptr<PodResourcesClient> kubelet, base::Reporter report);

  // Makes the directories, the preload file and every device's coordination file (repairing
  // one written over). Throws std::runtime_error.
  void prepare(const Inventory& inventory);
  // Checks every device's coordination file and makes whole any written over; how many were.
  int repair_coordination(const Inventory& inventory);

  // Whether containers of `resource` are given their limits at PreStartContainer.
  bool limits_at_pre_start(const Resource& resource) const;

  // Allocate for a slices or gpushare resource. Throws AllocationError.
  ContainerAllocation allocate(const Inventory& inventory, const PluginConfig& config,
                               const Resource& resource, const std::vector<std::string>& ids,
                               const HealthBoard& health);
  // PreStartContainer: writes the ledger of the container holding `ids` with its pod's limits.
  // Idempotent (the kubelet calls it again at each restart of the container). `numbering`: the
  // scheduler's numbering of this node's GPUs. Throws AllocationError saying why not.
  void pre_start(const Inventory& inventory, const Resource& resource,
                 const std::vector<std::string>& ids, const std::vector<std::string>& numbering);
  // GetPreferredAllocation: the IDs on the GPU the scheduler assigned to the container being
  // admitted, where that container can be told; else `fallback`'s choice.
  std::vector<std::string> prefer(const Inventory& inventory, const Resource& resource,
                                  const std::vector<std::string>& available,
                                  const std::vector<std::string>& must_include, int size,
                                  const std::vector<std::string>& numbering,
                                  const std::function<std::vector<std::string>()>& fallback) const;
  // An MPS container's ledger, holding it to its replicas' memory; the answer gains the hook,
  // the ledger and the limits' variables. Returns the limits as the log says them.
  std::string add_ledger(ContainerAllocation& allocation, const Inventory& inventory,
                         const Resource& resource, const std::vector<std::string>& ids,
                         const ContainerGrant& grant);

  // A DRA claim's directory (containers/<claim_container_id>): its ledger, written with
  // `grant`, and the mounts and variables its containers need, in `allocation`. Made again
  // over what a failed attempt left. `devices` names the claim's devices, for its owner record.
  // Throws AllocationError.
  void claim_container(ContainerAllocation& allocation, const Inventory& inventory,
                       const std::string& claim_uid, const std::vector<std::string>& devices,
                       const ContainerGrant& grant);
  // Removes what claim_container made; idempotent.
  base::Status remove_claim_container(const std::string& claim_uid);

  // Removes the directories of containers whose pods are no longer on this node and that no
  // live process uses, given the UIDs of those that are (DRA claims' are Unprepare's to
  // remove). Returns how many went.
  int collect(const std::set<std::string>& live_pod_uids);

  std::uint64_t assignments_rewritten() const { return rewritten_.load(); }

 private:
  struct Made {
    std::string id;
    contract::OwnerRecord record;
  };
  // A container's directory, its owner record and mounts; the ledger written now if `grant`.
  // `id` empty: a fresh one.
  Made make_container(ContainerAllocation& allocation, const Inventory& inventory,
                      const std::string& resource, const std::vector<std::string>& ids,
                      const std::vector<int>& gpus, const ContainerGrant* grant,
                      std::string id = "");
  void write_ledger(const std::string& id, const contract::OwnerRecord& record,
                    const ContainerGrant& grant) const;
  // The newest container allocated exactly `ids` of `resource`; empty if none.
  std::string find_container(const std::string& resource, std::vector<std::string> ids,
                             contract::OwnerRecord& record) const;
  void rewrite_assignment(const nlohmann::json& pod, const kube::RecordedAssignment& record,
                          int offset, const std::vector<int>& gpus,
                          const std::vector<std::string>& numbering,
                          const Inventory& inventory) const;

  contract::StateLayout layout_;
  const kube::Cluster* cluster_;
  std::string node_name_;
  std::unique_ptr<PodResourcesClient> kubelet_;
  base::Reporter report_;
  std::atomic<std::uint64_t> sequence_{0};
  mutable std::atomic<std::uint64_t> rewritten_{0};
};

}  // namespace tessera::node
