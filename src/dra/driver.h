// The DRA driver's node side: NodePrepareResources and NodeUnprepareResources for one node.
//
// Prepare reads the claim from the API server (the kubelet names only its namespace, name and
// UID), checks what was allocated against what this node publishes and has prepared already,
// and makes what the claim's containers need: the claim's directory with a ledger holding the
// exact limits its consumed capacity states (container_grants.h), and a CDI spec giving the
// device nodes, the hook, /etc/ld.so.preload, the ledger and each GPU's coordination file. It
// records the claim in a checkpoint last; a claim with a checkpoint gets the same answer again,
// so the kubelet's retries are harmless, and Unprepare after a restart finds what to remove.
// What Prepare makes is named by the claim's UID alone, so Unprepare removes it whether or not
// Prepare got as far as its checkpoint.
//
// Conflicts are refused: a whole GPU or MIG device prepared for one claim is not given to
// another, and the claims sharing a GPU never hold more memory or cores than it has.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/mutex.h"
#include "dra/claim.h"
#include "dra/pool.h"
#include "kube/cluster.h"
#include "node/config.h"
#include "node/container_grants.h"
#include "node/health.h"
#include "node/nvml.h"

namespace tessera::dra {

struct PreparedDevice {
  std::vector<std::string> request_names;
  std::string pool, device;
  std::vector<std::string> cdi_device_ids;
  bool operator==(const PreparedDevice&) const = default;
};

struct PrepareAnswer {
  std::vector<PreparedDevice> devices;
  std::string error;  // "" when prepared
};

struct DraDriverOptions {
  std::string driver;  // contract::kDraDriverName
  std::string node_name;
  std::string cdi_dir;
  std::string checkpoint_dir;  // one file per prepared claim
};

// A claim UID as the API server makes them (a UUID); anything else is refused before it names
// a file.
bool valid_claim_uid(const std::string& uid);

class DraDriver {
 public:
  DraDriver(DraDriverOptions options, const node::Inventory& inventory,
            const node::HealthBoard& health, node::ContainerGrants& grants,
            const kube::Cluster& cluster, std::function<node::PluginConfig()> served_config,
            base::Reporter report);

  // Makes the directories and reads the checkpoints of claims prepared before a restart.
  // Throws std::runtime_error when a directory cannot be made.
  void restore();
  PrepareAnswer prepare(const ClaimRef& claim) EXCLUDES(mutex_);
  // "" when nothing of the claim is left, else why.
  std::string unprepare(const ClaimRef& claim) EXCLUDES(mutex_);
  std::size_t prepared() const EXCLUDES(mutex_);
  // Prepare's answers per claim so far, retries included.
  std::uint64_t answers_prepared() const { return answers_prepared_.load(); }
  std::uint64_t answers_refused() const { return answers_refused_.load(); }

 private:
  // What a prepared claim holds, as the checkpoint keeps it.
  struct Held {
    std::string device;
    DeviceKind kind = DeviceKind::whole;
    int gpu = -1;
    std::uint64_t memory_bytes = 0;  // shared: what it consumes
    int cores = 0;
  };
  struct Prepared {
    ClaimRef claim;
    std::vector<Held> held;
    std::vector<PreparedDevice> answer;
  };
  PrepareAnswer prepare_claim(const ClaimRef& claim) EXCLUDES(mutex_);
  static nlohmann::json checkpoint_json(const Prepared& prepared);
  static Prepared checkpoint_from_json(const nlohmann::json& json);
  std::string checkpoint_path(const std::string& uid) const;
  // Throws ClaimError.
  std::vector<Held> check(const std::vector<AllocatedDevice>& devices) const REQUIRES(mutex_);
  Prepared make(const ClaimRef& claim, const std::vector<AllocatedDevice>& devices,
                std::vector<Held> held) REQUIRES(mutex_);
  void remove_made(const std::string& uid, std::vector<std::string>& failures) const;

  DraDriverOptions options_;
  const node::Inventory& inventory_;
  const node::HealthBoard& health_;
  node::ContainerGrants& grants_;
  const kube::Cluster& cluster_;
  std::function<node::PluginConfig()> served_config_;
  base::Reporter report_;
  mutable base::Mutex mutex_;
  std::map<std::string, Prepared> prepared_ GUARDED_BY(mutex_);  // by claim UID
  std::atomic<std::uint64_t> answers_prepared_{0}, answers_refused_{0};
};

}  // namespace tessera::dra
