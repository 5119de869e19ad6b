#include "ledger/demand.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>

#include "common/bounded_format.h"

namespace tessera::ledger {
namespace {

constexpr char kMagic[8] = {'T', 'E', 'S', 'S', 'D', 'M', 'N', 'D'};
constexpr std::uint32_t kVersion = 3;                  // 2: high-priority work; 3: its gaps
constexpr std::uint64_t kStaleNs = 60'000'000'000ull;  // a slot unused this long may be taken
// Stamps closer together than this are not written: readers keep their cached line.
constexpr std::uint64_t kStampResolutionNs = 1'000'000;

void initialize(void* base, const void*) {
  auto* file = static_cast<DemandFile*>(base);
  std::memset(static_cast<void*>(file), 0, sizeof(DemandFile));
  std::memcpy(file->magic, kMagic, sizeof kMagic);
  file->version = kVersion;
  file->slots = kDemandSlots;
}

}  // namespace

bool Demand::open(const char* directory, std::uint64_t group_id, ErrorText& error) {
  char path[4096];
  if (!format_bounded(path, sizeof path, error, "%s/tessera.demand", directory)) return false;
  if (!map_shared_file(path, sizeof(DemandFile), initialize, nullptr, mapping_, error))
    return false;
  auto* file = static_cast<DemandFile*>(mapping_.base);
  if (std::memcmp(file->magic, kMagic, sizeof kMagic) != 0 || file->version != kVersion ||
      file->slots != kDemandSlots) {
    mapping_.close();
    return error.set("%s: not a Tessera demand file of this version", path);
  }
  file_ = file;
  group_ = group_id;
  return true;
}

bool Demand::open_beside(const char* ledger_path, ErrorText& error) {
  struct stat status {};
  if (stat(ledger_path, &status) != 0) {
    return error.set("%s: cannot read its identity for the demand file", ledger_path);
  }
  char directory[4096];
  if (!format_bounded(directory, sizeof directory, error, "%s", ledger_path)) return false;
  const auto group = static_cast<std::uint64_t>(status.st_ino);
  char* slash = std::strrchr(directory, '/');
  if (slash == nullptr) return open(".", group, error);
  *slash = '\0';
  return open(directory, group, error);
}

bool Demand::stamp_is_recent(std::uint64_t stamp, std::uint64_t now_ns, std::uint64_t window_ns) {
  // A stamp far ahead of now is from before a reboot (CLOCK_MONOTONIC restarted): not recent.
  return stamp + window_ns >= now_ns && stamp <= now_ns + kStaleNs;
}

bool Demand::slot_is_stale(const DemandFile::Slot& slot, std::uint64_t now_ns) {
  for (const auto& stamp : slot.last_launch_ns) {
    if (stamp_is_recent(stamp.load(std::memory_order_relaxed), now_ns, kStaleNs)) return false;
  }
  return true;
}

// The group's slot: its own, else a free one, else one no group has stamped for a minute
// (slots are never given back, so groups that come and go would otherwise use them up).
int Demand::claim(std::uint64_t now_ns) {
  for (int i = 0; i < kDemandSlots; ++i) {
    DemandFile::Slot& slot = file_->slot[i];
    std::uint64_t owner = slot.group.load();
    if (owner == group_) return i;
    if ((owner == 0 || slot_is_stale(slot, now_ns)) &&
        slot.group.compare_exchange_strong(owner, group_)) {
      for (auto& stamp : slot.last_launch_ns) stamp.store(0, std::memory_order_relaxed);
      return i;
    }
    if (owner == group_) return i;  // another member of the group claimed it first
  }
  return -1;
}

void Demand::stamp(int device, std::uint64_t now_ns) {
  if (mine_ < 0 || file_->slot[mine_].group.load(std::memory_order_relaxed) != group_) {
    mine_ = claim(now_ns);
    if (mine_ < 0) return;  // every slot in use within the last minute
  }
  std::atomic<std::uint64_t>& last = file_->slot[mine_].last_launch_ns[device];
  const std::uint64_t previous = last.load(std::memory_order_relaxed);
  if (now_ns >= previous + kStampResolutionNs || now_ns < previous) {
    last.store(now_ns, std::memory_order_relaxed);
  }
}

bool Demand::others_active(int device, std::uint64_t now_ns, std::uint64_t window_ns) const {
  for (const auto& slot : file_->slot) {
    const std::uint64_t owner = slot.group.load(std::memory_order_relaxed);
    if (owner == 0 || owner == group_) continue;
    if (stamp_is_recent(slot.last_launch_ns[device].load(std::memory_order_relaxed), now_ns,
                        window_ns)) {
      return true;
    }
  }
  return false;
}

void Demand::add_high_work(int device, std::uint64_t launch_ns, std::uint64_t cost_ns,
                           std::uint32_t tolerance_percent) {
  file_->high_launch_ns[device].store(cost_ns, std::memory_order_relaxed);
  file_->high_tolerance_percent[device].store(tolerance_percent, std::memory_order_relaxed);
  std::atomic<std::uint64_t>& until = file_->high_work_until_ns[device];
  std::uint64_t queued = until.load(std::memory_order_relaxed);
  std::uint64_t start = 0;
  do {
    start = queued > launch_ns && queued <= launch_ns + kStaleNs ? queued : launch_ns;
  } while (!until.compare_exchange_weak(queued, start + cost_ns, std::memory_order_relaxed));
  if (queued != 0 && queued < launch_ns && launch_ns - queued < kStaleNs) {
    const std::uint64_t index =
        file_->high_gap_count[device].fetch_add(1, std::memory_order_relaxed) % kGapSamples;
    file_->high_gap_ns[device][index].store(launch_ns - queued, std::memory_order_relaxed);
  }
}

Demand::LowPlacement Demand::place_low_work(int device, std::uint64_t now_ns,
                                            std::uint64_t high_idle_since_ns, std::uint64_t cost_ns,
                                            std::uint64_t queue_allowed_ns) {
  const std::uint64_t seen = file_->high_gap_count[device].load(std::memory_order_relaxed);
  const int samples = seen < kGapSamples ? static_cast<int>(seen) : kGapSamples;
  std::atomic<std::uint64_t>& until = file_->low_work_until_ns[device];
  std::uint64_t placed = until.load(std::memory_order_relaxed);
  for (;;) {
    const std::uint64_t start = placed > now_ns && placed <= now_ns + kStaleNs ? placed : now_ns;
    // Costs come from a shared file: none may make a sum wrap.
    const std::uint64_t end = cost_ns <= kStaleNs ? start + cost_ns : UINT64_MAX;
    std::uint64_t launch_by = 0;
    if (end - now_ns <= queue_allowed_ns) {
      launch_by = UINT64_MAX;  // late, it queues behind less: still within the bound
    } else if (seen >= kMinLongerGaps && end != UINT64_MAX) {
      const std::uint64_t idle = start > high_idle_since_ns ? start - high_idle_since_ns : 0;
      // The shortest gap seen that lasted at least this long: the next launch may come then.
      // Judged from many such gaps: a few long pauses say little of the next.
      std::uint64_t shortest = UINT64_MAX;
      int longer = 0;
      for (int i = 0; i < samples; ++i) {
        const std::uint64_t gap = file_->high_gap_ns[device][i].load(std::memory_order_relaxed);
        if (gap <= idle || gap > kStaleNs) continue;  // a gap over a minute is no pattern
        ++longer;
        if (gap < shortest) shortest = gap;
      }
      if (longer >= kMinLongerGaps && cost_ns <= shortest - idle) {  // shortest > idle
        launch_by = high_idle_since_ns + shortest - cost_ns;
      }
    }
    if (launch_by == 0) {
      // Room in the queue once the work ahead has run down, if the queue can hold it at all.
      const bool fits_queue = cost_ns <= queue_allowed_ns && end != UINT64_MAX;
      return {false, 0, fits_queue ? end - queue_allowed_ns : 0};
    }
    if (until.compare_exchange_weak(placed, end, std::memory_order_relaxed)) {
      return {true, launch_by, 0};
    }
  }
}

std::uint64_t Demand::high_work_until(int device, std::uint64_t now_ns) const {
  const std::uint64_t until = file_->high_work_until_ns[device].load(std::memory_order_relaxed);
  return until <= now_ns + kStaleNs ? until : 0;
}

}  // namespace tessera::ledger
