#include "node/health.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "base/strings.h"

namespace tessera::node {
namespace {

using abi::nvmlEventTypeDoubleBitEccError;
using abi::nvmlEventTypeSingleBitEccError;
using abi::nvmlEventTypeXidCriticalError;

// The XIDs in a comma-separated list; entries that are not numbers are noted and skipped,
// as NVIDIA's plugin skips them.
std::set<std::uint64_t> xid_list(const std::string& text, const char* variable,
                                 std::vector<std::string>& notes) {
  std::set<std::uint64_t> xids;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    std::uint64_t xid = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), xid);
    if (!item.empty() && item != "all" && item != "xids") {
      if (error == std::errc() && end == item.data() + item.size()) {
        xids.insert(xid);
      } else {
        notes.push_back(
            fmt::format("{}: '{}' is not an XID; ignored", variable, item.substr(0, 40)));
      }
    }
    start = comma + 1;
  }
  return xids;
}

}  // namespace

bool HealthPolicy::critical(std::uint64_t type, std::uint64_t xid) const {
  if (!enabled || (type & event_types) == 0) return false;
  if (type == nvmlEventTypeDoubleBitEccError) return true;  // memory that cannot be trusted
  if (type != nvmlEventTypeXidCriticalError) return false;  // corrected errors: counted only
  if (ignored_xids.count(xid) > 0) return false;
  return all_critical || critical_xids.count(xid) > 0;
}

HealthPolicy health_policy(const HealthSettings& settings, const char* disable, const char* enable,
                           std::chrono::milliseconds recovery_quiet) {
  HealthPolicy policy;
  policy.enabled = !settings.disabled;
  policy.event_types = (settings.xid_events ? nvmlEventTypeXidCriticalError : 0) |
                       (settings.double_bit_ecc ? nvmlEventTypeDoubleBitEccError : 0) |
                       (settings.single_bit_ecc ? nvmlEventTypeSingleBitEccError : 0);
  policy.ignored_xids = settings.ignored_xids;
  policy.all_critical = settings.all_critical;
  policy.critical_xids = settings.critical_xids;
  policy.recovery_quiet = recovery_quiet;
  if (disable != nullptr && *disable != '\0') {
    const std::string value = base::lower(disable);
    if (value == "all" || value.find("xids") != std::string::npos) policy.enabled = false;
    for (const std::uint64_t xid : xid_list(value, "DP_DISABLE_HEALTHCHECKS", policy.notes)) {
      policy.ignored_xids.insert(xid);
    }
  }
  if (enable != nullptr && *enable != '\0') {
    const std::string value = base::lower(enable);
    if (value == "all") {
      policy.ignored_xids.clear();
    } else {
      for (const std::uint64_t xid : xid_list(value, "DP_ENABLE_HEALTHCHECKS", policy.notes)) {
        policy.ignored_xids.erase(xid);
      }
    }
  }
  return policy;
}

HealthBoard::HealthBoard(int gpus) : gpus_(static_cast<std::size_t>(std::max(gpus, 0))) {}

void HealthBoard::resize(int gpus) {
  base::MutexLock locked(mutex_);
  gpus_.resize(static_cast<std::size_t>(std::max(gpus, 0)));
}

bool HealthBoard::record_error(int gpu, const std::string& reason, Clock::time_point now) {
  base::MutexLock locked(mutex_);
  bool changed = false;
  for (std::size_t i = 0; i < gpus_.size(); ++i) {
    if (gpu >= 0 && static_cast<std::size_t>(gpu) != i) continue;
    changed = changed || gpus_[i].healthy;
    gpus_[i].healthy = false;
    gpus_[i].last_error = now;
    gpus_[i].reason = reason;
    ++gpus_[i].errors;
  }
  return changed;
}

bool HealthBoard::hold_down(int gpu, const std::string& reason, Clock::time_point now) {
  base::MutexLock locked(mutex_);
  if (gpu < 0 || static_cast<std::size_t>(gpu) >= gpus_.size()) return false;
  State& state = gpus_[static_cast<std::size_t>(gpu)];
  const bool changed = state.healthy;
  state.healthy = false;
  state.last_error = now;
  state.reason = reason;
  return changed;
}

bool HealthBoard::recover(std::chrono::milliseconds quiet, Clock::time_point now) {
  if (quiet.count() <= 0) return false;
  base::MutexLock locked(mutex_);
  bool changed = false;
  for (State& state : gpus_) {
    if (!state.healthy && now - state.last_error >= quiet) {
      state.healthy = true;
      changed = true;
    }
  }
  return changed;
}

HealthBoard::Clock::time_point HealthBoard::next_recovery(std::chrono::milliseconds quiet) const {
  base::MutexLock locked(mutex_);
  Clock::time_point next = Clock::time_point::max();
  if (quiet.count() <= 0) return next;
  for (const State& state : gpus_) {
    if (!state.healthy) next = std::min(next, state.last_error + quiet);
  }
  return next;
}

bool HealthBoard::set_service_down(int gpu, const std::string& reason) {
  base::MutexLock locked(mutex_);
  if (gpu < 0 || static_cast<std::size_t>(gpu) >= gpus_.size()) return false;
  State& state = gpus_[static_cast<std::size_t>(gpu)];
  const bool changed = state.service_down.empty() != reason.empty();
  state.service_down = reason;
  return changed;
}

bool HealthBoard::healthy(int gpu) const {
  base::MutexLock locked(mutex_);
  if (gpu < 0 || static_cast<std::size_t>(gpu) >= gpus_.size()) return true;
  const State& state = gpus_[static_cast<std::size_t>(gpu)];
  return state.healthy && state.service_down.empty();
}

std::string HealthBoard::reason(int gpu) const {
  base::MutexLock locked(mutex_);
  if (gpu < 0 || static_cast<std::size_t>(gpu) >= gpus_.size()) return {};
  const State& state = gpus_[static_cast<std::size_t>(gpu)];
  return state.service_down.empty() ? state.reason : state.service_down;
}

std::uint64_t HealthBoard::errors(int gpu) const {
  base::MutexLock locked(mutex_);
  if (gpu < 0 || static_cast<std::size_t>(gpu) >= gpus_.size()) return 0;
  return gpus_[static_cast<std::size_t>(gpu)].errors;
}

void HealthBoard::count_event(std::uint64_t xid) {
  base::MutexLock locked(mutex_);
  ++events_[xid];
}

std::map<std::uint64_t, std::uint64_t> HealthBoard::events() const {
  base::MutexLock locked(mutex_);
  return events_;
}

HealthMonitor::HealthMonitor(Nvml& nvml, const Inventory& inventory, HealthPolicy policy,
                             HealthBoard& board, std::function<void()> changed,
                             base::Reporter report)
    : nvml_(nvml),
      inventory_(inventory),
      policy_(std::move(policy)),
      board_(board),
      changed_(std::move(changed)),
      report_(std::move(report)) {
  for (const std::string& note : policy_.notes) report_(note);
  thread_ = std::thread([this] { run(); });
}

HealthMonitor::~HealthMonitor() {
  stop_ = true;
  thread_.join();
}

void HealthMonitor::run() {
  using Clock = HealthBoard::Clock;
  std::unique_ptr<EventSet> events;
  if (policy_.enabled) {
    try {
      events = std::make_unique<EventSet>(nvml_, inventory_, policy_.event_types);
      // A GPU that cannot be watched cannot be vouched for, as NVIDIA's plugin holds.
      for (const auto& [gpu, why] : events->unwatched()) {
        report_(
            fmt::format("GPU {} cannot be watched for errors ({}); marked unhealthy", gpu, why));
        if (board_.record_error(gpu, "cannot be watched: " + why, Clock::now())) changed_();
      }
    } catch (const std::exception& failure) {
      report_(fmt::format("health checks are off: {}", failure.what()));
    }
  } else {
    report_("health checks are disabled (config or DP_DISABLE_HEALTHCHECKS)");
  }
  while (!stop_) {
    // Wakes for an event, for the next GPU due to recover, or to notice a stop.
    const auto now = Clock::now();
    const auto due = board_.next_recovery(policy_.recovery_quiet);
    const auto until = std::min(due, now + std::chrono::milliseconds(250));
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
    const unsigned timeout = static_cast<unsigned>(std::max<long long>(wait_ms, 1));
    if (events != nullptr) {
      DeviceEvent event;
      std::string error;
      switch (events->wait(timeout, event, error)) {
        case EventSet::Outcome::event: {
          const std::uint64_t xid =
              event.type == abi::nvmlEventTypeXidCriticalError ? event.data : 48;
          if (event.type != abi::nvmlEventTypeSingleBitEccError) board_.count_event(xid);
          if (policy_.critical(event.type, event.data)) {
            const std::string reason = event.type == abi::nvmlEventTypeXidCriticalError
                                           ? fmt::format("XID {}", event.data)
                                           : std::string("uncorrectable (double-bit) ECC error");
            report_(fmt::format(
                "{} on GPU {}: its devices are unhealthy", reason,
                event.gpu < 0 ? std::string("(unknown: all)") : std::to_string(event.gpu)));
            if (board_.record_error(event.gpu, reason, Clock::now())) changed_();
          }
          break;
        }
        case EventSet::Outcome::failed:
          report_(fmt::format("waiting for GPU events failed: {}; every GPU is unhealthy", error));
          if (board_.record_error(-1, "event wait failed: " + error, Clock::now())) changed_();
          std::this_thread::sleep_for(std::chrono::milliseconds(250));  // not a busy loop
          break;
        case EventSet::Outcome::timeout:
          break;
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout));
    }
    // A GPU that cannot be watched cannot be vouched for, as NVIDIA's plugin holds: it stays
    // down however quiet it seems.
    if (events != nullptr) {
      for (const auto& [gpu, why] : events->unwatched()) {
        if (board_.hold_down(gpu, "cannot be watched: " + why, Clock::now())) changed_();
      }
    }
    if (board_.recover(policy_.recovery_quiet, Clock::now())) {
      report_("GPUs quiet for the recovery period are healthy again");
      changed_();
    }
  }
}

}  // namespace tessera::node
