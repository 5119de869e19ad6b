// The simulated machine as every process sees it: the device list and each device's
// memory in use, in one shared file, so physical capacity holds across all processes on
// the host. Like the real driver, a process's device memory is returned when it dies or
// execs (common/member_accounts.h).
//
// The file is TESSERA_SIM_STATE, or /dev/shm/tessera-sim-<uid>-<hash of the device list>.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "common/clock.h"
#include "common/error_text.h"
#include "common/member_accounts.h"
#include "common/shared_file.h"
#include "simgpu/sim_config.h"

namespace tessera::sim {

// One kernel (or graph node) as the device ran it: the device's own record of who used it
// when, independent of anything a limiter believes.
struct TimelineEntry {
  std::atomic<std::uint64_t> sequence;  // index + 1 once written: readers skip torn entries
  std::int32_t pid;
  std::int32_t device;
  std::uint64_t start_ns;  // CLOCK_MONOTONIC
  std::uint64_t end_ns;
};
inline constexpr std::uint64_t kTimelineEntries = 1u << 18;

// A device runs one piece of work at a time: each starts when the device and its stream
// are both free, in the order it was submitted.
struct DeviceClock {
  alignas(64) pthread_mutex_t lock;
  std::uint64_t busy_until_ns;
};

struct MachineFile {
  char magic[8];
  std::uint32_t version;
  std::uint32_t file_bytes;
  MachineSpec spec;
  SharedAccounts accounts;  // per process, per device bytes in use
  DeviceClock clocks[kMaxDevices];
  std::atomic<std::uint64_t> timeline_head;  // entries written so far
  TimelineEntry timeline[kTimelineEntries];  // a ring, sparse in the file until used
};

// One piece of work in the device's record.
struct WorkPiece {
  std::uint64_t start_ns, end_ns;
};

// Busy time seen by the device's record within a window.
struct BusyTime {
  std::uint64_t process_ns = 0;  // of the given process
  std::uint64_t device_ns = 0;   // of everyone
  bool complete = true;          // false if the ring no longer reaches back to the window
};

class Machine {
 public:
  // Reads the configuration and maps the shared state; idempotent. Async-safe to retry.
  bool attach(ErrorText& error);
  bool attached() const { return file_ != nullptr; }
  const MachineSpec& spec() const { return file_->spec; }

  // Takes bytes of device memory; false when the device is full.
  bool charge(int device, std::uint64_t bytes);
  void uncharge(int device, std::uint64_t bytes) { accounts_.release(device, bytes); }
  std::uint64_t used(int device) { return accounts_.usage(device).used; }
  std::uint64_t peak(int device) { return accounts_.usage(device).peak; }
  int processes(int device, std::int32_t* pids, std::uint64_t* used, int capacity) {
    return accounts_.list_members(device, pids, used, capacity);
  }

  void after_fork_in_child();

  // Queues `duration_ns` of work on device behind *stream_tail (the stream's last work) and
  // everything already on the device; moves *stream_tail to its end and records it.
  void occupy(int device, std::uint64_t* stream_tail, std::uint64_t duration_ns);
  // A marker (an event) queued now on device behind *stream_tail: when the device reaches
  // it, after everything submitted before it by any process. Moves *stream_tail there.
  std::uint64_t reach(int device, std::uint64_t* stream_tail);
  // What the record says about [from_ns, to_ns) on device, for pid (0: nobody in particular).
  BusyTime busy(int device, std::int32_t pid, std::uint64_t from_ns, std::uint64_t to_ns) const;
  // The pieces of work pid ran on device that started within [from_ns, to_ns), in the order
  // recorded; returns how many there were (up to `capacity` are stored), or -1 if the record
  // no longer reaches back to the window.
  int pieces(int device, std::int32_t pid, std::uint64_t from_ns, std::uint64_t to_ns,
             WorkPiece* out, int capacity) const;
  // The process is exiting: like the driver, free all it held on every device now.
  void release_process() { accounts_.leave(); }

 private:
  SharedMapping mapping_;
  MachineFile* file_ = nullptr;
  MemberAccounts accounts_;
};

// The process's one machine (each simulated library has its own handle on the file).
Machine& machine();

}  // namespace tessera::sim
