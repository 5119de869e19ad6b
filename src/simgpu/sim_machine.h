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

// A stretch of time the device ran one process's work: the device's own record of who used
// it when, independent of anything a limiter believes. A kernel cut by time slices leaves one
// entry per slice; the last (`completes`) also says when the kernel first started.
struct TimelineEntry {
  std::atomic<std::uint64_t> sequence;  // index + 1 once written: readers skip torn entries
  std::int32_t pid;
  std::int32_t device;
  std::uint64_t start_ns;  // CLOCK_MONOTONIC
  std::uint64_t end_ns;
  std::uint64_t work_start_ns;  // when the kernel this ran first started
  std::uint32_t completes;      // 1: the kernel ended here
  std::uint32_t sm_permille;    // the most of the device's SMs it could use (MPS: less)
};
inline constexpr std::uint64_t kTimelineEntries = 1u << 18;

// Work given to a device and not yet run to its end.
struct PendingWork {
  std::uint64_t ticket;
  std::uint64_t arrival_ns;
  std::uint64_t remaining_ns;
  std::uint64_t first_start_ns;  // 0 until it first runs
  std::uint64_t run_start_ns;    // while it has the device: since when; else 0
  std::int32_t pid;
  // Who the device time-slices between: the process itself, or, for MPS clients, their
  // server (negative), within which the clients' work runs concurrently.
  std::int32_t group;
  std::uint32_t sm_permille;
};
inline constexpr std::uint32_t kPendingPerDevice = 4096;
// How long a process keeps the device while another process's work waits, as a GPU
// time-slices between contexts.
inline constexpr std::uint64_t kTimeSliceNs = 2'000'000;

// A device runs one context's work at a time, each process's in submission order, and
// switches to a waiting context when the running one's time slice ends or it runs out of
// work. A context is a process, or an MPS server whose clients' kernels run side by side
// (each on its share of the SMs, which its kernels' durations already carry). The schedule
// is worked out lazily, up to the present, by whichever process asks.
struct DeviceSchedule {
  alignas(64) RobustMutex lock;
  // Guards the fields below. They are not annotated: the schedule is worked out by lambdas
  // over them, which the analysis sees as functions of their own.
  std::uint64_t resolved_ns;   // the schedule is decided and recorded up to here
  std::int32_t current_group;  // whose slice it is (PendingWork::group)
  std::uint64_t slice_left_ns;
  std::uint32_t count;
  PendingWork pending[kPendingPerDevice];  // in submission order
};

// When work ended, by ticket (a ring: a ticket long past is taken as done).
struct Completion {
  std::atomic<std::uint64_t> ticket;
  std::uint64_t end_ns;
};
inline constexpr std::uint64_t kCompletions = 1u << 16;

// An event a device raised (an XID critical error, an ECC error), as NVML's event sets
// report them. Raised from outside any CUDA process (tessera simgpu event), for tests and
// users to see what the node agent does with a failing GPU.
struct DeviceEvent {
  std::atomic<std::uint64_t> sequence;  // index + 1 once written: readers skip torn entries
  std::int32_t device;
  std::uint64_t type;  // nvmlEventType*
  std::uint64_t data;  // the XID
};
inline constexpr std::uint64_t kDeviceEvents = 1024;

// MIG as the driver keeps it per device (sim_nvml_mig.cpp works it): the mode, with a change
// pending until the GPU is reset, and the GPU instances with their compute instances.
inline constexpr int kMigSlots = 8;
struct MigComputeInstance {  // its ID is its slot
  std::uint32_t used;
  std::uint32_t profile;      // NVML_COMPUTE_INSTANCE_PROFILE_*, which is also its ID
  std::uint32_t start, size;  // in the GPU instance's compute slices
  std::uint32_t sms;
};
// What the driver knows of an instance once made, kept with it so that the simulated CUDA
// driver, which has no profile tables, can serve its MIG devices.
struct MigGpuInstance {
  std::uint32_t used;
  std::uint32_t id;
  std::uint32_t profile;      // NVML_GPU_INSTANCE_PROFILE_*
  std::uint32_t start, size;  // in memory slices
  std::uint32_t serial;       // unique per device: its MIG devices' UUIDs carry it
  std::uint32_t compute_slices, sms;
  std::uint64_t memory_mib;
  char name[24];  // the profile's: "MIG 1g.10gb"
  MigComputeInstance compute[kMigSlots];
};
struct MigState {
  std::uint32_t current, pending;  // NVML_DEVICE_MIG_*
  std::uint32_t next_serial;
  MigGpuInstance instances[kMigSlots];
};

// CUDA memory and work land on a simulated device: a whole GPU (0 to kMostDevices - 1) or a
// MIG GPU instance, numbered after them. The compute instances of one GPU instance share its
// memory and, in the simulation, its timeline.
inline constexpr int kMigDeviceBase = kMostDevices;
inline constexpr int kSimDevices = kMostDevices + kMostDevices * kMigSlots;
constexpr int mig_device_id(int gpu, int gi_slot) {
  return kMigDeviceBase + gpu * kMigSlots + gi_slot;
}
constexpr bool is_mig_device(int device) {
  return device >= kMigDeviceBase;
}
constexpr int gpu_of(int device) {
  return is_mig_device(device) ? (device - kMigDeviceBase) / kMigSlots : device;
}
constexpr int gi_slot_of(int device) {
  return (device - kMigDeviceBase) % kMigSlots;
}

// The UUID of the MIG device of compute instance `ci` in `instance` on GPU `gpu`.
void format_mig_uuid(int gpu, const MigGpuInstance& instance, int ci, char* text, std::size_t size);

struct MachineFile {
  char magic[8];
  std::uint32_t version;
  std::uint32_t file_bytes;
  MachineSpec spec;
  SharedAccounts accounts;                // per process, per device bytes in use
  DeviceSchedule schedules[kSimDevices];  // by simulated device
  std::atomic<std::uint64_t> next_ticket;
  Completion completions[kCompletions];
  std::atomic<std::uint64_t> timeline_head;  // entries written so far
  TimelineEntry timeline[kTimelineEntries];  // a ring
  // Events raised so far; the low 32 bits are also a futex word that waiters sleep on.
  std::atomic<std::uint64_t> events_raised;
  RobustMutex events_lock;            // one raiser at a time (readers check sequences)
  DeviceEvent events[kDeviceEvents];  // a ring
  RobustMutex mig_lock;               // held briefly, by MIG calls only
  MigState mig[kMostDevices] GUARDED_BY(mig_lock);
  // Per GPU, the bytes in use in each of its GPU instances, by instance slot.
  SharedAccounts mig_accounts[kMostDevices];
  // Per GPU, nvidia-smi compute-policy's time slice: 0 default, 1 short, 2 medium, 3 long.
  // Recorded only: the schedule's slice stays kTimeSliceNs (NVIDIA gives no lengths).
  std::atomic<std::uint32_t> compute_timeslice[kMostDevices];
};

// One piece of work in the device's record.
struct WorkPiece {
  std::uint64_t start_ns, end_ns;
};

// Busy time seen by the device's record within a window.
struct BusyTime {
  std::uint64_t process_ns = 0;     // of the given process
  std::uint64_t process_sm_ns = 0;  // the same, weighed by the share of SMs it could use
  std::uint64_t device_ns = 0;      // of everyone (MPS clients running side by side each count)
  bool complete = true;             // false if the ring no longer reaches back to the window
};

class Machine {
 public:
  // Reads the configuration and maps the shared state; idempotent. Async-safe to retry.
  bool attach(ErrorText& error);
  bool attached() const { return file_ != nullptr; }
  const MachineSpec& spec() const { return file_->spec; }

  // Takes bytes of a simulated device's memory; false when the device is full (or, for a MIG
  // device, its GPU instance is gone).
  bool charge(int device, std::uint64_t bytes);
  void uncharge(int device, std::uint64_t bytes) {
    if (device < 0 || device >= kSimDevices) return;
    accounts_of(device).release(account_index(device), bytes);
  }
  std::uint64_t used(int device) { return accounts_of(device).usage(account_index(device)).used; }
  std::uint64_t peak(int device) { return accounts_of(device).usage(account_index(device)).peak; }
  // What this process holds on a simulated device.
  std::uint64_t process_used(int device) {
    return accounts_of(device).member_used(account_index(device));
  }
  // The processes holding memory on a simulated device.
  int processes(int device, std::int32_t* pids, std::uint64_t* used, int capacity) {
    return accounts_of(device).list_members(account_index(device), pids, used, capacity);
  }
  // Whether any process holds memory on the GPU or any of its GPU instances.
  bool gpu_in_use(int gpu);
  // nvidia-smi compute-policy's time slice of a GPU (0 default .. 3 long).
  std::uint32_t compute_timeslice(int gpu) const {
    return file_->compute_timeslice[gpu].load(std::memory_order_relaxed);
  }
  void set_compute_timeslice(int gpu, std::uint32_t value) {
    file_->compute_timeslice[gpu].store(value, std::memory_order_relaxed);
  }
  int gpu_count() const { return file_->spec.device_count; }

  void after_fork_in_child();

  // From now on this process's work runs as a client of MPS server `server` (its daemon's
  // PID), beside the server's other clients, on `sm_permille` of the SMs.
  void join_mps_server(std::int32_t server, std::uint32_t sm_permille) {
    group_ = -server;
    sm_permille_ = sm_permille;
  }
  // Gives device `duration_ns` of work from this process, after its earlier work, on
  // `sm_permille` of the device's SMs (0: all this process may use); returns the work's
  // ticket (never 0).
  std::uint64_t submit(int device, std::uint64_t duration_ns, std::uint32_t sm_permille = 0);
  // Whether the work with `ticket` (0: none) has run to its end, and when it ended (0 if
  // none or too long ago to remember).
  bool done(int device, std::uint64_t ticket, std::uint64_t* end_ns);
  // Waits until it has; returns when it ended.
  std::uint64_t wait(int device, std::uint64_t ticket);
  // What the record says about [from_ns, to_ns) on device, for pid (0: nobody in particular).
  BusyTime busy(int device, std::int32_t pid, std::uint64_t from_ns, std::uint64_t to_ns);
  // The processes that ran on device within [from_ns, to_ns) and for how long each, up to
  // `capacity` of them; returns how many are stored.
  int busy_processes(int device, std::uint64_t from_ns, std::uint64_t to_ns, std::int32_t* pids,
                     std::uint64_t* busy_ns, int capacity);
  // The kernels pid ran on device that first started within [from_ns, to_ns), in the order
  // they ended, each from its first start to its end; returns how many there were (up to
  // `capacity` are stored), or -1 if the record no longer reaches back to the window.
  int pieces(int device, std::int32_t pid, std::uint64_t from_ns, std::uint64_t to_ns,
             WorkPiece* out, int capacity);
  // Raises an event on device, waking every process waiting for events.
  void raise_event(int device, std::uint64_t type, std::uint64_t data);
  // The device's MIG state, locked until unlock_mig (one device's or all: one lock).
  MigState& lock_mig(int device) ACQUIRE(mig_lock());
  void unlock_mig() RELEASE(mig_lock());
  // The lock lock_mig takes, for the analysis of functions that return holding it.
  RobustMutex& mig_lock() const RETURN_CAPABILITY(file_->mig_lock) { return file_->mig_lock; }
  std::uint64_t events_raised() const {
    return file_->events_raised.load(std::memory_order_acquire);
  }
  // The n-th event raised (from 0); false if the ring no longer holds it.
  bool event(std::uint64_t n, DeviceEvent& out) const;
  // Sleeps until more than `seen` events have been raised or timeout_ms has passed.
  void wait_for_event(std::uint64_t seen, unsigned timeout_ms) const;
  // The process is exiting: like the driver, free all it held on every device now.
  void release_process();

 private:
  // Whether the work with `ticket` is known to have ended (without working anything out).
  bool completed(std::uint64_t ticket, std::uint64_t* end_ns) const;
  // Works out what the device ran up to now and records it (the _locked form holds the
  // schedule's lock already).
  void advance(int device);
  void advance_locked(int device, std::uint64_t now_ns);
  // Records the run `work` has had since it got the device, up to end_ns.
  void record_run(int device, PendingWork& work, std::uint64_t end_ns);

  MemberAccounts& accounts_of(int device) {
    return is_mig_device(device) ? mig_accounts_[gpu_of(device)] : accounts_;
  }
  static int account_index(int device) {
    return is_mig_device(device) ? gi_slot_of(device) : device;
  }

  SharedMapping mapping_;
  MachineFile* file_ = nullptr;
  std::int32_t pid_ = 0;    // this process's, kept: getpid is a system call
  std::int32_t group_ = 0;  // 0: the process is its own context
  std::uint32_t sm_permille_ = 1000;
  MemberAccounts accounts_;
  MemberAccounts mig_accounts_[kMostDevices];
};

// The process's one machine (each simulated library has its own handle on the file).
Machine& machine();

}  // namespace tessera::sim
