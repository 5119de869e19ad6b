// Which groups want each device now: a small shared file beside the groups' ledgers
// (`<ledger directory>/tessera.demand`). Each governed launch stamps its group's slot; a
// group that may burst (use time nobody else wants) looks for other groups' recent stamps.
// High-priority groups also keep, per device, when the work they have queued is expected to
// be done, and the idle gaps they left lately; low-priority groups wait for that time, and
// reserve what they launch meanwhile on one low-priority timeline: a short queue, or a gap
// it fits.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/error_text.h"
#include "common/limits.h"
#include "common/shared_file.h"

namespace tessera::ledger {

inline constexpr int kDemandSlots = 256;
inline constexpr int kGapSamples = 256;  // recent high-priority idle gaps kept per device

struct DemandFile {
  char magic[8];
  std::uint32_t version, slots;
  // When all high-priority work launched on each device is expected to have run
  // (CLOCK_MONOTONIC ns): the latest any high-priority group has queued to.
  alignas(64) std::atomic<std::uint64_t> high_work_until_ns[kMaxDevices];
  // The device time of the latest high-priority launch on each device.
  std::atomic<std::uint64_t> high_launch_ns[kMaxDevices];
  // The latency high-priority groups give up to low-priority work, in percent of a launch.
  std::atomic<std::uint32_t> high_tolerance_percent[kMaxDevices];
  // The idle gaps high-priority work left on each device: from when its queued work was
  // expected to be done to its next launch. A ring: entry `count % kGapSamples` is next.
  std::atomic<std::uint64_t> high_gap_ns[kMaxDevices][kGapSamples];
  std::atomic<std::uint64_t> high_gap_count[kMaxDevices];
  // When the low-priority work launched while high-priority work was about is expected to be
  // done: all low-priority groups of the device queue on this one timeline.
  std::atomic<std::uint64_t> low_work_until_ns[kMaxDevices];
  struct alignas(64) Slot {            // a line of its own: groups stamp, others read
    std::atomic<std::uint64_t> group;  // the group's ledger inode; 0: free
    std::atomic<std::uint64_t> last_launch_ns[kMaxDevices];
  } slot[kDemandSlots];
};

class Demand {
 public:
  // Opens (creating if needed) the demand file in `directory` for the group `group_id`
  // (non-zero, the same for all its members).
  bool open(const char* directory, std::uint64_t group_id, ErrorText& error);
  // The same for the group whose ledger is `ledger_path`: the file in the ledger's directory,
  // the ledger's inode as the group's identity.
  bool open_beside(const char* ledger_path, ErrorText& error);
  bool is_open() const { return file_ != nullptr; }
  // Records that the group launched on device now (to within a millisecond).
  void stamp(int device, std::uint64_t now_ns);
  // Whether another group launched on device within `window_ns` before now.
  bool others_active(int device, std::uint64_t now_ns, std::uint64_t window_ns) const;
  // A high-priority group queued work of `cost_ns` on device at `launch_ns`: it runs after
  // whatever high-priority work is still pending there. If none was, the gap since that work
  // was expected to be done is recorded. `tolerance_percent`: the group's latency tolerance.
  void add_high_work(int device, std::uint64_t launch_ns, std::uint64_t cost_ns,
                     std::uint32_t tolerance_percent);
  // What a low-priority launch may do while high-priority work is about.
  struct LowPlacement {
    bool placed;  // reserved: launch now
    std::uint64_t
        launch_by;           // placed: the launch must reach the device by then (else decide again)
    std::uint64_t retry_at;  // not placed: when the low-priority queue will have room for it
  };
  // Low-priority work of `cost_ns`, at `now_ns` while high-priority work has been idle on
  // device since `high_idle_since_ns`. It queues after all low-priority work already reserved
  // (every low-priority group's), and is reserved (placed) if then either
  // - the queue it ends stays within `queue_allowed_ns` of now: a high-priority launch that
  //   comes at any moment waits at most that for low-priority work; or
  // - it ends before every recent gap that lasted as long as this one so far, of which there
  //   must be kMinLongerGaps: the next launch comes during it in at most about 1 gap of
  //   kMinLongerGaps, rarer than the 1 in 100 a 99th percentile may lose. Such work must
  //   reach the device by `launch_by` to end in time.
  LowPlacement place_low_work(int device, std::uint64_t now_ns, std::uint64_t high_idle_since_ns,
                              std::uint64_t cost_ns, std::uint64_t queue_allowed_ns);
  static constexpr int kMinLongerGaps = 200;
  std::uint32_t high_tolerance_percent(int device) const {
    return file_->high_tolerance_percent[device].load(std::memory_order_relaxed);
  }
  // When the high-priority work queued on device is expected to be done; 0 if never, or if
  // the time is from before a reboot.
  std::uint64_t high_work_until(int device, std::uint64_t now_ns) const;
  // The device time of the latest high-priority launch on device.
  std::uint64_t high_launch_cost(int device) const {
    return file_->high_launch_ns[device].load(std::memory_order_relaxed);
  }

 private:
  static bool stamp_is_recent(std::uint64_t stamp, std::uint64_t now_ns, std::uint64_t window_ns);
  static bool slot_is_stale(const DemandFile::Slot& slot, std::uint64_t now_ns);
  int claim(std::uint64_t now_ns);

  SharedMapping mapping_;
  DemandFile* file_ = nullptr;
  std::uint64_t group_ = 0;
  int mine_ = -1;
};

}  // namespace tessera::ledger
