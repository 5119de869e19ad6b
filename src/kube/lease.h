// Leader election through a coordination.k8s.io/v1 Lease, as client-go's leaderelection
// does it, so that several replicas can run with one active:
// - a replica takes the Lease when it is free or its holder has not renewed it for the
//   Lease's duration, as this replica observed it (its own clock, not the holder's);
// - the holder renews it every retry period, and stops leading when it could not renew for
//   the renew deadline, which is shorter than the duration: the old leader has stopped
//   before anyone else may take over;
// - a replica stopped cleanly gives the Lease up, so that another takes it at once.
// Follow mode only reads a Lease another program holds (a kube-scheduler in the same pod): it
// leads while that Lease's holder is this replica, named `identity` or `identity_<suffix>`.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "base/log.h"
#include "kube/cluster.h"
#include "kube/reflector.h"

namespace tessera::kube {

struct LeaseSettings {
  std::string namespace_name = "kube-system";
  std::string name = "tessera-scheduler";
  std::string identity;  // unique per replica: the pod's name
  std::chrono::seconds duration{15};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  bool follow = false;  // read the Lease only; never take it
};

// Why `settings` cannot elect safely (empty if they can): names that are not DNS names, no
// identity, or periods out of order (retry period < renew deadline < duration).
std::string why_not_valid(const LeaseSettings& settings);

class LeaderElector {
 public:
  // `report` hears of API server failures, once per change of what fails.
  LeaderElector(const Cluster& cluster, LeaseSettings settings, base::Reporter report = {});

  // One round: reads the Lease, takes it if free or expired, renews it if held. Returns
  // whether this replica holds it now.
  bool try_acquire_or_renew();
  // Rounds every retry period until `stop`. When this replica comes to hold the Lease,
  // `on_change(true)` runs before leading() turns true: the caller makes its state current
  // there, and returning false (not ready) leaves leading() false until a later round's call
  // returns true. `on_change(false)` runs once it no longer holds the Lease. At `stop` a held
  // Lease is given up.
  void run(const std::atomic<bool>& stop, const std::function<bool(bool)>& on_change);
  // Whether this replica leads now: it holds the Lease, renewed within the renew deadline.
  bool leading() const;
  // Gives the Lease up if this replica holds it (holder emptied), so that another replica
  // need not wait for it to expire.
  void release();

  const LeaseSettings& settings() const { return settings_; }

 private:
  using Clock = std::chrono::steady_clock;
  ObjectName lease() const;
  bool holds() const;
  void note_failure(const std::string& failure);
  nlohmann::json lease_object(const std::string& holder, const std::string& acquired,
                              int transitions, const std::string& version,
                              int duration_seconds) const;

  const Cluster& cluster_;
  LeaseSettings settings_;
  base::Reporter report_;
  // The Lease's record as last read (holder, times, transitions), and when it last changed on
  // this replica's clock: expiry is judged from that, never from the holder's clock.
  std::string observed_record_;
  Clock::time_point observed_at_{};
  std::string last_failure_;
  std::atomic<std::int64_t> holds_until_ns_{0};  // steady clock; 0: not held
  std::atomic<bool> announced_{false};           // on_change(true) has run
};

}  // namespace tessera::kube
