// A device's coordination file: where every group using one GPU (or one MIG device) meets the
// others, whatever process, container or pod it is in, and whatever ordinal it sees the device
// as. One file per device, named by the device's key (contract/layout.h says where). Each
// governed launch stamps its group's slot; a group that may burst (use time nobody else wants)
// looks for other groups' recent stamps. High-priority groups also keep when the work they have
// queued is expected to be done, and the idle gaps they left lately; low-priority groups wait
// for that time, and reserve what they launch meanwhile on one low-priority timeline: a short
// queue, or a gap it fits.
//
// The header (the device's key, under a checksum) is written once, by the node agent for a
// node's devices or by the first group to use a device outside a cluster, and verified by every
// opener. The rest is written by every group: it holds stamps and times, never a limit or a
// priority, so writing it cannot raise anyone's. A time far ahead is ignored (from before a
// reboot); a header written over is damage, which the hook answers conservatively (hook.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "common/error_text.h"
#include "common/limits.h"
#include "common/shared_file.h"
#include "contract/layout.h"

namespace tessera::ledger {

inline constexpr int kDemandSlots = 256;
inline constexpr int kGapSamples = 256;  // recent high-priority idle gaps kept

struct DemandHeader {
  char magic[8];
  std::uint32_t version, slots;
  char device[40];  // the device's key, NUL-terminated
  std::uint64_t checksum;
};

struct DemandFile {
  DemandHeader header;
  // When all high-priority work launched on the device is expected to have run
  // (CLOCK_MONOTONIC ns): the latest any high-priority group has queued to.
  alignas(64) std::atomic<std::uint64_t> high_work_until_ns;
  // The device time of the latest high-priority launch.
  std::atomic<std::uint64_t> high_launch_ns;
  // The latency high-priority groups give up to low-priority work, in percent of a launch.
  std::atomic<std::uint32_t> high_tolerance_percent;
  std::atomic<std::uint64_t> high_gap_count;
  // When the low-priority work launched while high-priority work was about is expected to be
  // done: all low-priority groups of the device queue on this one timeline.
  std::atomic<std::uint64_t> low_work_until_ns;
  // The idle gaps high-priority work left: from when its queued work was expected to be done
  // to its next launch. A ring: entry `high_gap_count % kGapSamples` is next.
  alignas(64) std::atomic<std::uint64_t> high_gap_ns[kGapSamples];
  struct alignas(64) Slot {            // a line of its own: groups stamp, others read
    std::atomic<std::uint64_t> group;  // the group's identity; 0: free
    std::atomic<std::uint64_t> last_launch_ns;
  } slot[kDemandSlots];
};

class Demand {
 public:
  // Opens the coordination file of the device `key` at `path` for the group `group_id`
  // (non-zero, the same for all its members), creating it if it does not exist. Refuses, naming
  // the file and what is wrong, one that is not a coordination file of this version, is for
  // another device, or whose header fails its checksum.
  bool open(const char* path, const contract::DeviceKey& key, std::uint64_t group_id,
            ErrorText& error);
  void close();
  // Whether the header is still the one verified at open: false once something wrote over it.
  bool intact() const;
  // Makes the file whole again in place, for every group using it: maps it again over what the
  // process has there (a truncation leaves zeroes), restores its size, writes the header anew.
  // The mapping stays where it is, so other threads of the process may go on using it. False,
  // with `error`, if it cannot be done now.
  bool repair(ErrorText& error);

  // Records that the group launched now (to within a millisecond).
  void stamp(std::uint64_t now_ns);
  // Whether another group launched within `window_ns` before now.
  bool others_active(std::uint64_t now_ns, std::uint64_t window_ns) const;
  // A high-priority group queued work of `cost_ns` at `launch_ns`: it runs after whatever
  // high-priority work is still pending. If none was, the gap since that work was expected to
  // be done is recorded. `tolerance_percent`: the group's latency tolerance.
  void add_high_work(std::uint64_t launch_ns, std::uint64_t cost_ns,
                     std::uint32_t tolerance_percent);
  // What a low-priority launch may do while high-priority work is about.
  struct LowPlacement {
    bool placed;              // reserved: launch now
    std::uint64_t launch_by;  // placed: the launch must reach the device by then (else decide
                              // again)
    std::uint64_t retry_at;   // not placed: when the low-priority queue will have room for it
  };
  // Low-priority work of `cost_ns`, at `now_ns` while high-priority work has been idle since
  // `high_idle_since_ns`. It queues after all low-priority work already reserved (every
  // low-priority group's), and is reserved (placed) if then either
  // - the queue it ends stays within `queue_allowed_ns` of now: a high-priority launch that
  //   comes at any moment waits at most that for low-priority work; or
  // - it ends before every recent gap that lasted as long as this one so far, of which there
  //   must be kMinLongerGaps: the next launch comes during it in at most about 1 gap of
  //   kMinLongerGaps, rarer than the 1 in 100 a 99th percentile may lose. Such work must
  //   reach the device by `launch_by` to end in time.
  LowPlacement place_low_work(std::uint64_t now_ns, std::uint64_t high_idle_since_ns,
                              std::uint64_t cost_ns, std::uint64_t queue_allowed_ns);
  static constexpr int kMinLongerGaps = 200;
  std::uint32_t high_tolerance_percent() const {
    return file_->high_tolerance_percent.load(std::memory_order_relaxed);
  }
  // When the high-priority work queued is expected to be done; 0 if never, or if the time is
  // from before a reboot.
  std::uint64_t high_work_until(std::uint64_t now_ns) const;
  // The device time of the latest high-priority launch.
  std::uint64_t high_launch_cost() const {
    return file_->high_launch_ns.load(std::memory_order_relaxed);
  }

 private:
  static bool stamp_is_recent(std::uint64_t stamp, std::uint64_t now_ns, std::uint64_t window_ns);
  int claim(std::uint64_t now_ns);

  SharedMapping mapping_;
  DemandFile* file_ = nullptr;
  DemandHeader verified_{};
  std::uint64_t group_ = 0;
  int mine_ = -1;
};

// For the node agent: makes the coordination file of the device `key` at `path` (readable and
// writable by every container's processes, whatever their user) if it is missing, and writes
// its header anew, in place, if something wrote over it; `repaired` says so. The groups using
// it keep their mapping. False, with `error`, if the file cannot be made or mapped.
bool prepare_coordination_file(const char* path, const contract::DeviceKey& key, bool& repaired,
                               ErrorText& error);

// A group's identity in coordination files, from its ledger file (device and inode): the same
// for every member, in a container or outside it. 0 if the file cannot be read.
std::uint64_t group_identity(const char* ledger_path);

}  // namespace tessera::ledger
