#include "kube/lease.h"

#include <fmt/core.h>
#include <time.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "kube/json_input.h"
#include "kube/objects.h"

namespace tessera::kube {
namespace {

// A Lease's times are MicroTime: RFC 3339 with microseconds, in UTC.
std::string micro_time_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z", utc.tm_year + 1900,
                     utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, micros);
}

std::int64_t since_epoch_ns(std::chrono::steady_clock::time_point at) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
}

// The longest duration a Lease read from the API server may claim: a holder that says it
// holds for a year must not lock every other replica out for a year.
constexpr int kMostLeaseSeconds = 3600;

struct LeaseRecord {
  std::string holder, acquired, renewed, version;
  int duration_seconds = 0;
  int transitions = 0;
  std::string key() const {
    return fmt::format("{}|{}|{}|{}|{}", holder, acquired, renewed, duration_seconds, transitions);
  }
};

// The parts of a Lease that election reads; throws std::runtime_error if it is not a Lease.
LeaseRecord read_lease(const std::string& body) {
  const nlohmann::json lease = parse_outside_json(body);
  if (!lease.is_object()) throw std::runtime_error("the Lease is not a JSON object");
  LeaseRecord record;
  record.holder = string_at(lease, "/spec/holderIdentity"_json_pointer);
  record.acquired = string_at(lease, "/spec/acquireTime"_json_pointer);
  record.renewed = string_at(lease, "/spec/renewTime"_json_pointer);
  record.version = string_at(lease, "/metadata/resourceVersion"_json_pointer);
  const auto number = [&](const nlohmann::json::json_pointer& at) {
    if (!lease.contains(at)) return 0;
    const nlohmann::json& value = lease[at];
    if (!value.is_number_integer()) {
      throw std::runtime_error(fmt::format("the Lease's {} is not an integer", at.to_string()));
    }
    return static_cast<int>(
        std::clamp<std::int64_t>(value.get<std::int64_t>(), 0, std::int64_t{1} << 30));
  };
  record.duration_seconds =
      std::min(number("/spec/leaseDurationSeconds"_json_pointer), kMostLeaseSeconds);
  record.transitions = number("/spec/leaseTransitions"_json_pointer);
  return record;
}

}  // namespace

std::string why_not_valid(const LeaseSettings& settings) {
  if (!dns_name(settings.namespace_name, 63, false)) {
    return fmt::format("lease namespace '{}' is not a DNS label", settings.namespace_name);
  }
  if (!dns_name(settings.name, 253, true)) {
    return fmt::format("lease name '{}' is not a DNS subdomain", settings.name);
  }
  if (settings.identity.empty() || settings.identity.size() > 253) {
    return "the replica's identity must be 1 to 253 characters";
  }
  if (settings.duration.count() < 1 || settings.duration.count() > kMostLeaseSeconds) {
    return fmt::format("lease duration {} s must be 1 to {} s", settings.duration.count(),
                       kMostLeaseSeconds);
  }
  if (!(settings.retry_period.count() > 0 && settings.retry_period < settings.renew_deadline &&
        settings.renew_deadline < settings.duration)) {
    return fmt::format(
        "periods must rise: retry period {} ms < renew deadline {} ms < lease duration {} s",
        settings.retry_period.count(), settings.renew_deadline.count(), settings.duration.count());
  }
  return {};
}

LeaderElector::LeaderElector(const Cluster& cluster, LeaseSettings settings, base::Reporter report)
    : cluster_(cluster), settings_(std::move(settings)), report_(std::move(report)) {}

ObjectName LeaderElector::lease() const {
  return {settings_.namespace_name, settings_.name};
}

void LeaderElector::note_failure(const std::string& failure) {
  if (failure != last_failure_ && !failure.empty()) {
    base::tell(report_,
               fmt::format("lease {}/{}: {}", settings_.namespace_name, settings_.name, failure));
  }
  last_failure_ = failure;
}

nlohmann::json LeaderElector::lease_object(const std::string& holder, const std::string& acquired,
                                           int transitions, const std::string& version,
                                           int duration_seconds) const {
  nlohmann::json metadata{{"name", settings_.name}, {"namespace", settings_.namespace_name}};
  if (!version.empty()) metadata["resourceVersion"] = version;
  return nlohmann::json{{"apiVersion", "coordination.k8s.io/v1"},
                        {"kind", "Lease"},
                        {"metadata", metadata},
                        {"spec",
                         {{"holderIdentity", holder},
                          {"leaseDurationSeconds", duration_seconds},
                          {"acquireTime", acquired},
                          {"renewTime", micro_time_now()},
                          {"leaseTransitions", transitions}}}};
}

bool LeaderElector::holds() const {
  return since_epoch_ns(Clock::now()) < holds_until_ns_.load();
}

bool LeaderElector::leading() const {
  return announced_.load() && holds();
}

bool LeaderElector::try_acquire_or_renew() {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + settings_.retry_period;
  // Held until the renew deadline counted from before the request: the API server may have
  // recorded the renewal at any moment after this.
  const auto held_from_now = [&] {
    holds_until_ns_ = since_epoch_ns(start + settings_.renew_deadline);
    note_failure({});
    return true;
  };
  const ApiResponse read = cluster_.get_lease(lease(), deadline);
  if (read.status == 404 && !settings_.follow) {
    const std::string now = micro_time_now();
    const ApiResponse created = cluster_.create_lease(
        lease(),
        lease_object(settings_.identity, now, 0, "", static_cast<int>(settings_.duration.count())),
        deadline);
    if (created.status == 200 || created.status == 201) return held_from_now();
    if (created.status != 409) {  // 409: another replica created it first
      note_failure(fmt::format("cannot create it: HTTP {} {}", created.status, created.error));
    }
    return holds();
  }
  if (read.status != 200) {
    note_failure(fmt::format("cannot read it: HTTP {} {}", read.status, read.error));
    return holds();
  }
  LeaseRecord record;
  try {
    record = read_lease(read.body);
  } catch (const std::exception& failure) {
    note_failure(fmt::format("cannot read it: {}", failure.what()));
    return holds();
  }
  if (record.key() != observed_record_) {
    observed_record_ = record.key();
    observed_at_ = start;
  }
  const int duration_seconds = record.duration_seconds > 0
                                   ? record.duration_seconds
                                   : static_cast<int>(settings_.duration.count());
  const bool expired = start >= observed_at_ + std::chrono::seconds(duration_seconds);
  if (settings_.follow) {
    const bool ours =
        record.holder == settings_.identity || record.holder.starts_with(settings_.identity + "_");
    if (ours && !expired) {
      // Led while the holder's last renewal, as observed, is within the renew deadline.
      holds_until_ns_ = since_epoch_ns(observed_at_ + settings_.renew_deadline);
      note_failure({});
    } else {
      holds_until_ns_ = 0;
    }
    return holds();
  }
  const bool mine = record.holder == settings_.identity;
  if (!mine && !record.holder.empty() && !expired) {
    holds_until_ns_ = 0;
    return false;
  }
  const ApiResponse written = cluster_.replace_lease(
      lease(),
      lease_object(settings_.identity, mine ? record.acquired : micro_time_now(),
                   record.transitions + (mine ? 0 : 1), record.version,
                   static_cast<int>(settings_.duration.count())),
      deadline);
  if (written.status == 200) return held_from_now();
  if (written.status != 409) {  // 409: another replica wrote it since it was read
    note_failure(fmt::format("cannot write it: HTTP {} {}", written.status, written.error));
  }
  return holds();
}

void LeaderElector::release() {
  if (settings_.follow || !holds()) return;
  holds_until_ns_ = 0;
  announced_ = false;
  const ApiResponse read = cluster_.get_lease(lease(), Clock::now() + settings_.retry_period);
  if (read.status != 200) return;
  try {
    const LeaseRecord record = read_lease(read.body);
    if (record.holder != settings_.identity) return;
    cluster_.replace_lease(lease(),
                           lease_object("", record.acquired, record.transitions, record.version, 1),
                           Clock::now() + settings_.retry_period);
  } catch (const std::exception&) {
    // Unreadable now: the Lease expires in its own time.
  }
}

void LeaderElector::run(const std::atomic<bool>& stop, const std::function<bool(bool)>& on_change) {
  while (!stop) {
    const Clock::time_point round = Clock::now();
    const bool held = try_acquire_or_renew();
    if (held && !announced_) {
      announced_ = on_change(true);
    } else if (!held && announced_) {
      announced_ = false;
      on_change(false);
    }
    while (!stop && Clock::now() < round + settings_.retry_period) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  release();
}

}  // namespace tessera::kube
