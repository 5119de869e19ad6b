// GPU health: NVML's XID and ECC events make a GPU unhealthy (every device advertised for it,
// replicas and slices alike), and a GPU that stays quiet for the recovery period is healthy
// again. NVIDIA's plugin marks one replica and never recovers; both are known defects.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "base/mutex.h"
#include "node/config.h"
#include "node/nvml.h"

namespace tessera::node {

// What makes a GPU unhealthy, from the config's health section and NVIDIA's variables:
// DP_DISABLE_HEALTHCHECKS=all|xids turns checks off, or lists more XIDs to ignore;
// DP_ENABLE_HEALTHCHECKS lists ignored XIDs to count again (all: ignore none).
struct HealthPolicy {
  bool enabled = true;
  std::uint64_t event_types = 0;  // nvmlEventType* to watch
  std::set<std::uint64_t> ignored_xids;
  bool all_critical = true;
  std::set<std::uint64_t> critical_xids;
  std::chrono::milliseconds recovery_quiet{60000};  // 0: never recover
  std::vector<std::string> notes;                   // variable entries that were not XIDs

  // Whether this event makes its GPU unhealthy.
  bool critical(std::uint64_t type, std::uint64_t xid) const;
};
HealthPolicy health_policy(const HealthSettings& settings, const char* disable, const char* enable,
                           std::chrono::milliseconds recovery_quiet);

// Each GPU's health, shared by the monitor (writer) and the plugins (readers).
class HealthBoard {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HealthBoard(int gpus = 0);
  void resize(int gpus);
  // Records an error on `gpu` (-1: every GPU); returns whether any GPU's health changed.
  bool record_error(int gpu, const std::string& reason, Clock::time_point now);
  // Keeps `gpu` unhealthy as of `now` without counting an error (a GPU nobody can watch must
  // not recover by staying quiet); returns whether its health changed.
  bool hold_down(int gpu, const std::string& reason, Clock::time_point now);
  // A service the GPU's devices need (its MPS control daemon) is down for `reason`, or, with
  // an empty reason, up again: unlike an error, the GPU is healthy again as soon as it is up.
  // Returns whether that changed.
  bool set_service_down(int gpu, const std::string& reason);
  // GPUs quiet for `quiet` since their last error are healthy again; returns whether any was.
  bool recover(std::chrono::milliseconds quiet, Clock::time_point now);
  // When the next GPU would recover (time_point::max() if none is unhealthy).
  Clock::time_point next_recovery(std::chrono::milliseconds quiet) const;
  bool healthy(int gpu) const;
  std::string reason(int gpu) const;  // the last error, or ""
  std::uint64_t errors(int gpu) const;
  // Device events seen, by XID (uncorrectable ECC errors as XID 48, as the driver reports them).
  void count_event(std::uint64_t xid);
  std::map<std::uint64_t, std::uint64_t> events() const;

 private:
  struct State {
    bool healthy = true;
    Clock::time_point last_error{};
    std::string reason;
    std::uint64_t errors = 0;
    std::string service_down;  // why a service it needs is down; "" while it is up
  };
  mutable base::Mutex mutex_;
  std::vector<State> gpus_ GUARDED_BY(mutex_);
  std::map<std::uint64_t, std::uint64_t> events_ GUARDED_BY(mutex_);
};

// Waits on an NVML event set and feeds the board; calls `changed` after every health change.
class HealthMonitor {
 public:
  HealthMonitor(Nvml& nvml, const Inventory& inventory, HealthPolicy policy, HealthBoard& board,
                std::function<void()> changed, base::Reporter report);
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

 private:
  void run();
  Nvml& nvml_;
  Inventory inventory_;
  HealthPolicy policy_;
  HealthBoard& board_;
  std::function<void()> changed_;
  base::Reporter report_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tessera::node
