// Which groups want each device now: a small shared file beside the groups' ledgers
// (`<ledger directory>/tessera.demand`). Each governed launch stamps its group's slot; a
// group that may burst (use time nobody else wants) looks for other groups' recent stamps.
// High-priority groups also keep, per device, when the work they have queued is expected to
// be done; low-priority groups wait for that time.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/error_text.h"
#include "common/limits.h"
#include "common/shared_file.h"

namespace tessera::ledger {

inline constexpr int kDemandSlots = 256;

struct DemandFile {
  char magic[8];
  std::uint32_t version, slots;
  // When all high-priority work launched on each device is expected to have run
  // (CLOCK_MONOTONIC ns): the latest any high-priority group has queued to.
  alignas(64) std::atomic<std::uint64_t> high_work_until_ns[kMaxDevices];
  // The device time of the latest high-priority launch on each device.
  std::atomic<std::uint64_t> high_launch_ns[kMaxDevices];
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
  // whatever high-priority work is still pending there.
  void add_high_work(int device, std::uint64_t launch_ns, std::uint64_t cost_ns);
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
