#include "ledger/demand.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace tessera::ledger {
namespace {

constexpr char kMagic[8] = {'T', 'E', 'S', 'S', 'D', 'M', 'N', 'D'};
// 2: high-priority work; 3: its gaps; 4: one file per device, with its key under a checksum.
constexpr std::uint32_t kVersion = 4;
constexpr std::uint64_t kStaleNs = 60'000'000'000ull;  // a slot unused this long may be taken
// Stamps closer together than this are not written: readers keep their cached line.
constexpr std::uint64_t kStampResolutionNs = 1'000'000;

std::uint64_t header_checksum(const DemandHeader& header) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a over everything before the checksum
  const auto* bytes = reinterpret_cast<const unsigned char*>(&header);
  for (std::size_t i = 0; i < offsetof(DemandHeader, checksum); ++i) {
    hash = (hash ^ bytes[i]) * 1099511628211ull;
  }
  return hash;
}

DemandHeader header_for(const contract::DeviceKey& key) {
  DemandHeader header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = kVersion;
  header.slots = kDemandSlots;
  std::memcpy(header.device, key.text, sizeof key.text);
  header.checksum = header_checksum(header);
  return header;
}

void initialize(void* base, const void* context) {
  auto* file = static_cast<DemandFile*>(base);
  std::memset(static_cast<void*>(file), 0, sizeof(DemandFile));
  file->header = header_for(*static_cast<const contract::DeviceKey*>(context));
}

// Why the header at `file` is not the one for `key`, or nullptr.
const char* header_fault(const DemandHeader& header, const contract::DeviceKey& key) {
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0) return "not a coordination file";
  if (header.version != kVersion || header.slots != kDemandSlots) {
    return "a coordination file of another version";
  }
  if (header.checksum != header_checksum(header)) return "its header fails its checksum";
  if (std::memcmp(header.device, key.text, sizeof key.text) != 0) {
    return "the coordination file of another device";
  }
  return nullptr;
}

}  // namespace

bool Demand::open(const char* path, const contract::DeviceKey& key, std::uint64_t group_id,
                  ErrorText& error) {
  close();
  if (!map_shared_file(path, sizeof(DemandFile), initialize, &key, mapping_, error)) return false;
  guard_against_truncation(mapping_);
  fchmod(mapping_.fd, 0666);  // groups of other users use it too (refused unless it is ours)
  auto* file = static_cast<DemandFile*>(mapping_.base);
  const DemandHeader header = file->header;
  if (const char* fault = header_fault(header, key); fault != nullptr) {
    mapping_.close();
    return error.set("%s: %s (device %s)", path, fault, key.text);
  }
  file_ = file;
  verified_ = header;
  group_ = group_id;
  mine_ = -1;
  return true;
}

void Demand::close() {
  mapping_.close();
  file_ = nullptr;
}

bool Demand::intact() const {
  return file_ != nullptr && std::memcmp(&file_->header, &verified_, sizeof verified_) == 0;
}

bool Demand::repair(ErrorText& error) {
  if (file_ == nullptr) return error.set("no coordination file is open");
  struct stat status {};
  if (fstat(mapping_.fd, &status) != 0 ||
      (static_cast<std::size_t>(status.st_size) != sizeof(DemandFile) &&
       ftruncate(mapping_.fd, static_cast<off_t>(sizeof(DemandFile))) != 0)) {
    return error.set("a coordination file cut short cannot be made whole: %s",
                     std::strerror(errno));
  }
  if (mmap(mapping_.base, mapping_.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
           mapping_.fd, 0) == MAP_FAILED) {
    return error.set("a coordination file cannot be mapped again: %s", std::strerror(errno));
  }
  if (!intact()) file_->header = verified_;
  return true;
}

bool Demand::stamp_is_recent(std::uint64_t stamp, std::uint64_t now_ns, std::uint64_t window_ns) {
  // A stamp far ahead of now is from before a reboot (CLOCK_MONOTONIC restarted): not recent.
  return stamp + window_ns >= now_ns && stamp <= now_ns + kStaleNs;
}

// The group's slot: its own, else a free one, else one no group has stamped for a minute
// (slots are never given back, so groups that come and go would otherwise use them up).
int Demand::claim(std::uint64_t now_ns) {
  for (int i = 0; i < kDemandSlots; ++i) {
    DemandFile::Slot& slot = file_->slot[i];
    std::uint64_t owner = slot.group.load();
    if (owner == group_) return i;
    const bool stale =
        !stamp_is_recent(slot.last_launch_ns.load(std::memory_order_relaxed), now_ns, kStaleNs);
    if ((owner == 0 || stale) && slot.group.compare_exchange_strong(owner, group_)) {
      slot.last_launch_ns.store(0, std::memory_order_relaxed);
      return i;
    }
    if (owner == group_) return i;  // another member of the group claimed it first
  }
  return -1;
}

void Demand::stamp(std::uint64_t now_ns) {
  if (mine_ < 0 || file_->slot[mine_].group.load(std::memory_order_relaxed) != group_) {
    mine_ = claim(now_ns);
    if (mine_ < 0) return;  // every slot in use within the last minute
  }
  std::atomic<std::uint64_t>& last = file_->slot[mine_].last_launch_ns;
  const std::uint64_t previous = last.load(std::memory_order_relaxed);
  if (now_ns >= previous + kStampResolutionNs || now_ns < previous) {
    last.store(now_ns, std::memory_order_relaxed);
  }
}

bool Demand::others_active(std::uint64_t now_ns, std::uint64_t window_ns) const {
  for (const auto& slot : file_->slot) {
    const std::uint64_t owner = slot.group.load(std::memory_order_relaxed);
    if (owner == 0 || owner == group_) continue;
    if (stamp_is_recent(slot.last_launch_ns.load(std::memory_order_relaxed), now_ns, window_ns)) {
      return true;
    }
  }
  return false;
}

void Demand::add_high_work(std::uint64_t launch_ns, std::uint64_t cost_ns,
                           std::uint32_t tolerance_percent) {
  file_->high_launch_ns.store(cost_ns, std::memory_order_relaxed);
  file_->high_tolerance_percent.store(tolerance_percent, std::memory_order_relaxed);
  std::atomic<std::uint64_t>& until = file_->high_work_until_ns;
  std::uint64_t queued = until.load(std::memory_order_relaxed);
  std::uint64_t start = 0;
  do {
    start = queued > launch_ns && queued <= launch_ns + kStaleNs ? queued : launch_ns;
  } while (!until.compare_exchange_weak(queued, start + cost_ns, std::memory_order_relaxed));
  if (queued != 0 && queued < launch_ns && launch_ns - queued < kStaleNs) {
    const std::uint64_t index =
        file_->high_gap_count.fetch_add(1, std::memory_order_relaxed) % kGapSamples;
    file_->high_gap_ns[index].store(launch_ns - queued, std::memory_order_relaxed);
  }
}

Demand::LowPlacement Demand::place_low_work(std::uint64_t now_ns, std::uint64_t high_idle_since_ns,
                                            std::uint64_t cost_ns, std::uint64_t queue_allowed_ns) {
  const std::uint64_t seen = file_->high_gap_count.load(std::memory_order_relaxed);
  const int samples = seen < kGapSamples ? static_cast<int>(seen) : kGapSamples;
  std::atomic<std::uint64_t>& until = file_->low_work_until_ns;
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
        const std::uint64_t gap = file_->high_gap_ns[i].load(std::memory_order_relaxed);
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

std::uint64_t Demand::high_work_until(std::uint64_t now_ns) const {
  const std::uint64_t until = file_->high_work_until_ns.load(std::memory_order_relaxed);
  return until <= now_ns + kStaleNs ? until : 0;
}

bool prepare_coordination_file(const char* path, const contract::DeviceKey& key, bool& repaired,
                               ErrorText& error) {
  repaired = false;
  SharedMapping mapping;
  if (!map_shared_file(path, sizeof(DemandFile), initialize, &key, mapping, error)) {
    // Cut short or grown: its size is restored in place, so the containers that have it
    // mounted (the same file) find it whole again.
    if (truncate(path, static_cast<off_t>(sizeof(DemandFile))) != 0 ||
        !map_shared_file(path, sizeof(DemandFile), initialize, &key, mapping, error)) {
      return false;
    }
    repaired = true;
  }
  fchmod(mapping.fd, 0666);  // the container's processes, whatever their user, coordinate in it
  auto* file = static_cast<DemandFile*>(mapping.base);
  if (header_fault(file->header, key) != nullptr) {
    file->header = header_for(key);
    repaired = true;
  }
  mapping.close();
  return true;
}

std::uint64_t group_identity(const char* ledger_path) {
  struct stat status {};
  if (stat(ledger_path, &status) != 0) return 0;
  const std::uint64_t identity =
      (static_cast<std::uint64_t>(status.st_dev) << 40) ^ static_cast<std::uint64_t>(status.st_ino);
  return identity != 0 ? identity : 1;
}

}  // namespace tessera::ledger
