#include "simgpu/sim_machine.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/bounded_format.h"

namespace tessera::sim {
namespace {

constexpr char kMagic[8] = {'T', 'E', 'S', 'S', 'S', 'I', 'M', 'G'};
constexpr std::uint32_t kVersion = 7;  // 2: time-sliced schedules; 3: slot bound; 4: events;
                                       // 5: MIG profiles per device; 6: MIG devices for CUDA;
                                       // 7: compute policy
// A waiter looks again no sooner than this: its work may end any moment, but not every
// microsecond is worth the schedule's lock.
constexpr std::uint64_t kShortestWaitNs = 20'000;

void initialize_file(void* base, const void* context) {
  auto* file = static_cast<MachineFile*>(base);
  std::memcpy(file->magic, kMagic, sizeof kMagic);
  file->version = kVersion;
  file->file_bytes = sizeof(MachineFile);
  std::memcpy(&file->spec, context, sizeof(MachineSpec));
  initialize_accounts(file->accounts);
  for (DeviceSchedule& schedule : file->schedules) initialize_robust_mutex(&schedule.lock);
  // Touched now, once: a page first written later would fault while the schedule's lock is
  // held, by whichever process happens to work the schedule out (on a disk-backed state
  // file, for as long as a block allocation takes).
  std::memset(static_cast<void*>(file->completions), 0, sizeof file->completions);
  std::memset(static_cast<void*>(file->timeline), 0, sizeof file->timeline);
  std::memset(static_cast<void*>(file->events), 0, sizeof file->events);
  initialize_robust_mutex(&file->events_lock);
  std::memset(static_cast<void*>(file->mig), 0, sizeof file->mig);
  initialize_robust_mutex(&file->mig_lock);
  for (SharedAccounts& accounts : file->mig_accounts) initialize_accounts(accounts);
}

// Each GPU's instance accounts take their own range of liveness locks, after the machine's.
int mig_lock_base(int gpu) {
  return (1 + gpu) * kMostMembers;
}

// The futex word in the low half of the events counter (x86-64 is little-endian).
std::uint32_t* event_word(std::atomic<std::uint64_t>& counter) {
  return reinterpret_cast<std::uint32_t*>(&counter);
}

std::uint64_t hash_bytes(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

}  // namespace

bool Machine::attach(ErrorText& error) {
  if (file_ != nullptr) return true;
  MachineSpec spec;
  if (!machine_spec_from_environment(spec, error)) return false;
  char path[4096];
  if (const char* explicit_path = std::getenv("TESSERA_SIM_STATE"); explicit_path != nullptr) {
    if (!format_bounded(path, sizeof path, error, "%s", explicit_path)) {
      ErrorText reason = error;
      return error.set("TESSERA_SIM_STATE: %s", reason.text);
    }
  } else {
    // The name depends on the device list and the file's layout, so neither a different
    // configuration nor an older Tessera's file is ever picked up.
    const std::uint64_t layout[2] = {kVersion, sizeof(MachineFile)};
    const std::uint64_t hash =
        hash_bytes(&spec, sizeof spec) ^ (hash_bytes(layout, sizeof layout) * 31);
    std::snprintf(path, sizeof path, "/dev/shm/tessera-sim-%u-%016llx",
                  static_cast<unsigned>(getuid()), static_cast<unsigned long long>(hash));
  }
  if (!map_shared_file(path, sizeof(MachineFile), initialize_file, &spec, mapping_, error)) {
    return false;
  }
  auto* file = static_cast<MachineFile*>(mapping_.base);
  int bad_slot = 0;
  if (std::memcmp(file->magic, kMagic, sizeof kMagic) != 0 || file->version != kVersion ||
      file->file_bytes != sizeof(MachineFile) || !accounts_look_valid(file->accounts, bad_slot)) {
    mapping_.close();
    return error.set("%s: not a simulated-GPU state file of this version", path);
  }
  if (std::memcmp(&file->spec, &spec, sizeof spec) != 0) {
    mapping_.close();
    return error.set(
        "%s: was made for a different device list; set TESSERA_SIM_STATE to a new "
        "path or remove the file",
        path);
  }
  for (int gpu = 0; gpu < kMostDevices; ++gpu) {
    if (!accounts_look_valid(file->mig_accounts[gpu], bad_slot)) {
      mapping_.close();
      return error.set("%s: not a simulated-GPU state file of this version", path);
    }
  }
  accounts_.attach(&file->accounts, mapping_.fd);
  for (int gpu = 0; gpu < kMostDevices; ++gpu) {
    mig_accounts_[gpu].attach(&file->mig_accounts[gpu], mapping_.fd, mig_lock_base(gpu));
  }
  if (!accounts_.join(error)) {
    mapping_.close();
    return false;
  }
  file_ = file;
  pid_ = static_cast<std::int32_t>(getpid());
  return true;
}

void Machine::after_fork_in_child() {
  if (file_ == nullptr) return;
  pid_ = static_cast<std::int32_t>(getpid());
  group_ = 0;  // an MPS client's child is no client until it initialises CUDA again
  sm_permille_ = 1000;
  mapping_.reopen_in_child();
  accounts_.forget_slot();  // the child joins on its first charge
  for (MemberAccounts& accounts : mig_accounts_) accounts.forget_slot();
}

void Machine::release_process() {
  accounts_.leave();
  for (MemberAccounts& accounts : mig_accounts_) accounts.leave();
}

bool Machine::charge(int device, std::uint64_t bytes) {
  if (device < 0 || device >= kSimDevices) return false;
  std::uint64_t capacity = 0;
  if (is_mig_device(device)) {
    // The instance's memory, as long as it exists: the driver refuses to destroy an instance
    // that holds memory, so one charged here stays until its memory is given back.
    const MigGpuInstance& instance = lock_mig(gpu_of(device)).instances[gi_slot_of(device)];
    capacity = instance.used != 0 ? instance.memory_mib << 20 : 0;
    unlock_mig();
  } else {
    capacity = file_->spec.devices[device].memory_bytes;
  }
  MemberAccounts& accounts = accounts_of(device);
  ErrorText ignored;
  if (capacity == 0 || !accounts.join(ignored)) return false;
  return accounts.reserve(account_index(device), bytes, capacity);
}

bool Machine::gpu_in_use(int gpu) {
  std::int32_t pid[1];
  std::uint64_t bytes[1];
  if (processes(gpu, pid, bytes, 1) > 0) return true;
  for (int slot = 0; slot < kMigSlots; ++slot) {
    if (processes(mig_device_id(gpu, slot), pid, bytes, 1) > 0) return true;
  }
  return false;
}

void format_mig_uuid(int gpu, const MigGpuInstance& instance, int ci, char* text,
                     std::size_t size) {
  std::snprintf(text, size, "MIG-7e55e7a0-%04x-4%03x-8%03x-%012x",
                static_cast<unsigned>(gpu) & 0xffff, instance.id & 0xfff,
                static_cast<unsigned>(ci) & 0xfff, instance.serial);
}

std::uint64_t Machine::submit(int device, std::uint64_t duration_ns, std::uint32_t sm_permille) {
  DeviceSchedule& schedule = file_->schedules[device];
  for (;;) {
    lock_robust_whole(&schedule.lock);  // a dead owner leaves only whole values behind
    const std::uint64_t now = monotonic_ns();
    // Only queued here, the lock held briefly: working the schedule out is left to those
    // who wait or ask, unless the queue is full.
    if (schedule.count == kPendingPerDevice) advance_locked(device, now);
    if (schedule.count < kPendingPerDevice) {
      const std::uint64_t ticket = file_->next_ticket.fetch_add(1, std::memory_order_relaxed) + 1;
      // Not before what is already decided: another process may have worked it out to a
      // moment after this one read the clock.
      schedule.pending[schedule.count++] =
          PendingWork{ticket,
                      now > schedule.resolved_ns ? now : schedule.resolved_ns,
                      duration_ns,
                      0,
                      0,
                      pid_,
                      group_ != 0 ? group_ : pid_,
                      sm_permille != 0 && sm_permille < sm_permille_ ? sm_permille : sm_permille_};
      unlock_robust(&schedule.lock);
      return ticket;
    }
    unlock_robust(&schedule.lock);  // the device's queue is full, as a driver's can be
    sleep_until_ns(now + 100'000);
  }
}

bool Machine::completed(std::uint64_t ticket, std::uint64_t* end_ns) const {
  if (end_ns != nullptr) *end_ns = 0;
  if (ticket == 0) return true;
  const Completion& completion = file_->completions[ticket % kCompletions];
  if (completion.ticket.load(std::memory_order_acquire) == ticket) {
    if (end_ns != nullptr) *end_ns = completion.end_ns;
    return true;
  }
  // Overwritten by later tickets: long done.
  return ticket + kCompletions <= file_->next_ticket.load(std::memory_order_relaxed);
}

bool Machine::done(int device, std::uint64_t ticket, std::uint64_t* end_ns) {
  if (completed(ticket, end_ns)) return true;
  advance(device);
  return completed(ticket, end_ns);
}

std::uint64_t Machine::wait(int device, std::uint64_t ticket) {
  DeviceSchedule& schedule = file_->schedules[device];
  for (std::uint64_t end = 0;;) {
    if (completed(ticket, &end)) return end;
    lock_robust_whole(&schedule.lock);
    const std::uint64_t now = monotonic_ns();
    advance_locked(device, now);
    if (completed(ticket, &end)) {
      unlock_robust(&schedule.lock);
      return end;
    }
    // It cannot end before the work ahead of it in its own process has run, nor while
    // another process keeps the device for the rest of its slice.
    std::uint64_t ahead = 0, running = 0;
    for (std::uint32_t i = 0; i < schedule.count; ++i) {
      const PendingWork& work = schedule.pending[i];
      if (work.ticket <= ticket && work.pid == pid_) ahead += work.remaining_ns;
      if (work.group == schedule.current_group && work.pid != pid_) {
        running = std::max(running, work.remaining_ns);
      }
    }
    if (running > schedule.slice_left_ns) running = schedule.slice_left_ns;
    unlock_robust(&schedule.lock);
    const std::uint64_t bound = ahead + running;
    sleep_until_ns(now + (bound > kShortestWaitNs ? bound : kShortestWaitNs));
  }
}

void Machine::record_run(int device, PendingWork& work, std::uint64_t end_ns) {
  if (end_ns == work.run_start_ns) {  // a marker (an event) takes no time: nothing to record
    work.run_start_ns = 0;
    return;
  }
  const std::uint64_t index = file_->timeline_head.fetch_add(1, std::memory_order_relaxed);
  TimelineEntry& entry = file_->timeline[index % kTimelineEntries];
  entry.sequence.store(0, std::memory_order_relaxed);
  entry.pid = work.pid;
  entry.device = device;
  entry.start_ns = work.run_start_ns;
  entry.end_ns = end_ns;
  entry.work_start_ns = work.first_start_ns;
  entry.completes = work.remaining_ns == 0 ? 1 : 0;
  entry.sm_permille = work.sm_permille;
  entry.sequence.store(index + 1, std::memory_order_release);
  work.run_start_ns = 0;
}

void Machine::advance(int device) {
  DeviceSchedule& schedule = file_->schedules[device];
  lock_robust_whole(&schedule.lock);
  advance_locked(device, monotonic_ns());
  unlock_robust(&schedule.lock);
}

void Machine::advance_locked(int device, std::uint64_t now_ns) {
  DeviceSchedule& schedule = file_->schedules[device];
  if (now_ns <= schedule.resolved_ns) return;
  PendingWork* const pending = schedule.pending;
  const std::uint32_t count = schedule.count <= kPendingPerDevice ? schedule.count : 0;
  // Work is queued in arrival order (each arrival is read under the lock, never before what
  // is resolved), so a scan ends at the first piece that has not arrived. Finished work is
  // marked with ticket 0 and removed in one pass at the end: a full queue of markers is
  // then worked out in linear time, as a driver retires them, not in quadratic.
  std::uint32_t first_live = 0;
  auto first_arrived = [&](std::uint64_t time, bool current, std::uint64_t* next_arrival) {
    for (std::uint32_t i = first_live; i < count; ++i) {
      const PendingWork& work = pending[i];
      if (work.ticket == 0) continue;
      if (work.arrival_ns > time) {
        if (next_arrival != nullptr) *next_arrival = work.arrival_ns;
        return -1;
      }
      if ((work.group == schedule.current_group) == current) return static_cast<int>(i);
    }
    return -1;
  };
  // The work that runs at `time` in the current context: its first piece, or for an MPS
  // server each client's first piece (in order, up to kMostConcurrent clients). Also the
  // next arrival, which may join them.
  constexpr int kMostConcurrent = 48;  // MPS's most clients per device
  int running[kMostConcurrent];
  auto runnable = [&](std::uint64_t time, std::uint64_t& next_arrival) {
    int found = 0;
    for (std::uint32_t i = first_live; i < count && found < kMostConcurrent; ++i) {
      const PendingWork& work = pending[i];
      if (work.ticket == 0 || work.group != schedule.current_group) continue;
      if (work.arrival_ns > time) {
        next_arrival = std::min(next_arrival, work.arrival_ns);
        break;
      }
      bool behind = false;  // a process's work runs in order: only its first piece
      for (int j = 0; j < found && !behind; ++j) behind = pending[running[j]].pid == work.pid;
      if (!behind) running[found++] = static_cast<int>(i);
      if (schedule.current_group >= 0) break;  // a process runs one piece at a time
    }
    return found;
  };
  auto preempt_current = [&](std::uint64_t time) {  // its slice is over
    for (std::uint32_t i = first_live; i < count; ++i) {
      if (pending[i].ticket != 0 && pending[i].run_start_ns != 0)
        record_run(device, pending[i], time);
    }
  };
  std::uint64_t time = schedule.resolved_ns;
  for (;;) {
    while (first_live < count && pending[first_live].ticket == 0) ++first_live;
    if (time >= now_ns || first_live == count) break;
    // Who may run at `time`: the current context if it has work that has arrived and slice
    // left or nobody else waiting; else the context whose waiting work came first.
    std::uint64_t next_arrival = UINT64_MAX;
    const int mine = first_arrived(time, true, &next_arrival);
    const bool choose = mine < 0 || schedule.slice_left_ns == 0;
    const int other = choose ? first_arrived(time, false, &next_arrival) : -1;
    if (mine < 0 && other < 0) {  // idle until the next arrival, which gets a whole slice
      schedule.current_group = 0;
      schedule.slice_left_ns = 0;
      time = next_arrival < now_ns ? next_arrival : now_ns;
      continue;
    }
    if (mine < 0 || (schedule.slice_left_ns == 0 && other >= 0)) {
      if (mine >= 0) preempt_current(time);
      schedule.current_group = pending[other].group;
      schedule.slice_left_ns = kTimeSliceNs;
    } else if (schedule.slice_left_ns == 0) {
      schedule.slice_left_ns = kTimeSliceNs;  // alone: it keeps the device
    }
    std::uint64_t joins = UINT64_MAX;
    const int found = runnable(time, joins);
    std::uint64_t run = schedule.slice_left_ns;
    if (run > now_ns - time) run = now_ns - time;
    if (joins > time && joins - time < run) run = joins - time;  // a client's work arrives
    // Side by side, the pieces share the SMs: asking more than the device has in all, each
    // runs at the device's SMs over what they ask (work is in time on its own share).
    std::uint64_t asked = 0;
    for (int j = 0; j < found; ++j) asked += pending[running[j]].sm_permille;
    const std::uint64_t crowd = asked > 1000 ? asked : 1000;
    for (int j = 0; j < found; ++j) {
      run = std::min(run, (pending[running[j]].remaining_ns * crowd + 999) / 1000);
    }
    const std::uint64_t progress = run * 1000 / crowd;
    for (int j = 0; j < found; ++j) {
      PendingWork& work = pending[running[j]];
      if (work.first_start_ns == 0) work.first_start_ns = time;
      if (work.run_start_ns == 0) work.run_start_ns = time;
      work.remaining_ns -= std::min(progress, work.remaining_ns);
      if (work.remaining_ns == 0) {
        record_run(device, work, time + run);
        Completion& completion = file_->completions[work.ticket % kCompletions];
        completion.end_ns = time + run;
        completion.ticket.store(work.ticket, std::memory_order_release);
        work.ticket = 0;
      }
    }
    schedule.slice_left_ns -= run;
    time += run;
  }
  std::uint32_t kept = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (pending[i].ticket != 0) pending[kept++] = pending[i];
  }
  schedule.count = kept;
  schedule.resolved_ns = now_ns;
}

namespace {

// Visits each whole entry of the device record, oldest first; true if the record reaches
// back to from_ns (the ring has not yet overwritten anything that started after it).
template <typename Visit>
bool walk_record(const MachineFile& file, std::uint64_t from_ns, Visit visit) {
  const std::uint64_t head = file.timeline_head.load(std::memory_order_acquire);
  const std::uint64_t oldest = head > kTimelineEntries ? head - kTimelineEntries : 0;
  std::uint64_t earliest_seen = UINT64_MAX;
  for (std::uint64_t index = oldest; index < head; ++index) {
    const TimelineEntry& entry = file.timeline[index % kTimelineEntries];
    if (entry.sequence.load(std::memory_order_acquire) != index + 1) continue;
    if (entry.start_ns < earliest_seen) earliest_seen = entry.start_ns;
    visit(entry);
  }
  return oldest == 0 || earliest_seen <= from_ns;
}

}  // namespace

BusyTime Machine::busy(int device, std::int32_t pid, std::uint64_t from_ns, std::uint64_t to_ns) {
  advance(device);
  BusyTime busy;
  busy.complete = walk_record(*file_, from_ns, [&](const TimelineEntry& entry) {
    if (entry.device != device) return;
    const std::uint64_t start = entry.start_ns > from_ns ? entry.start_ns : from_ns;
    const std::uint64_t end = entry.end_ns < to_ns ? entry.end_ns : to_ns;
    if (end <= start) return;
    busy.device_ns += end - start;
    if (entry.pid == pid) {
      busy.process_ns += end - start;
      busy.process_sm_ns += (end - start) * entry.sm_permille / 1000;
    }
  });
  return busy;
}

int Machine::busy_processes(int device, std::uint64_t from_ns, std::uint64_t to_ns,
                            std::int32_t* pids, std::uint64_t* busy_ns, int capacity) {
  advance(device);
  int count = 0;
  walk_record(*file_, from_ns, [&](const TimelineEntry& entry) {
    if (entry.device != device) return;
    const std::uint64_t start = entry.start_ns > from_ns ? entry.start_ns : from_ns;
    const std::uint64_t end = entry.end_ns < to_ns ? entry.end_ns : to_ns;
    if (end <= start) return;
    int slot = 0;
    while (slot < count && pids[slot] != entry.pid) ++slot;
    if (slot == count) {
      if (count == capacity) return;  // the rest are left out, as a full buffer would
      pids[count] = entry.pid;
      busy_ns[count++] = 0;
    }
    busy_ns[slot] += end - start;
  });
  return count;
}

int Machine::pieces(int device, std::int32_t pid, std::uint64_t from_ns, std::uint64_t to_ns,
                    WorkPiece* out, int capacity) {
  advance(device);
  int count = 0;
  const bool complete = walk_record(*file_, from_ns, [&](const TimelineEntry& entry) {
    if (entry.device != device || entry.pid != pid || entry.completes == 0) return;
    if (entry.work_start_ns < from_ns || entry.work_start_ns >= to_ns) return;
    if (count < capacity) out[count] = {entry.work_start_ns, entry.end_ns};
    ++count;
  });
  return complete ? count : -1;
}

// Runs when the process exits (or the library is unloaded).
[[gnu::destructor]] void release_at_exit() {
  if (machine().attached()) machine().release_process();
}

Machine& machine() {
  static Machine instance;  // constant-initialised: no guard, no destructor ordering issue
  return instance;
}

void Machine::raise_event(int device, std::uint64_t type, std::uint64_t data) {
  lock_robust_whole(&file_->events_lock);  // raisers are rare; readers never take it
  const std::uint64_t index = file_->events_raised.load(std::memory_order_relaxed);
  DeviceEvent& entry = file_->events[index % kDeviceEvents];
  entry.sequence.store(0, std::memory_order_release);
  entry.device = device;
  entry.type = type;
  entry.data = data;
  entry.sequence.store(index + 1, std::memory_order_release);
  file_->events_raised.store(index + 1, std::memory_order_release);
  unlock_robust(&file_->events_lock);
  // Shared, not private: waiters in other processes sleep on the same word.
  syscall(SYS_futex, event_word(file_->events_raised), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

MigState& Machine::lock_mig(int device) {
  lock_robust_whole(&file_->mig_lock);
  return file_->mig[device];
}

void Machine::unlock_mig() {
  unlock_robust(&file_->mig_lock);
}

bool Machine::event(std::uint64_t n, DeviceEvent& out) const {
  const DeviceEvent& entry = file_->events[n % kDeviceEvents];
  if (entry.sequence.load(std::memory_order_acquire) != n + 1) return false;
  out.device = entry.device;
  out.type = entry.type;
  out.data = entry.data;
  return entry.sequence.load(std::memory_order_acquire) == n + 1;  // not rewritten meanwhile
}

void Machine::wait_for_event(std::uint64_t seen, unsigned timeout_ms) const {
  const std::uint64_t deadline = monotonic_ns() + std::uint64_t{timeout_ms} * 1'000'000;
  for (;;) {
    const std::uint64_t raised = file_->events_raised.load(std::memory_order_acquire);
    const std::uint64_t now = monotonic_ns();
    if (raised > seen || now >= deadline) return;
    const std::uint64_t left = deadline - now;
    timespec wait{static_cast<time_t>(left / 1'000'000'000),
                  static_cast<long>(left % 1'000'000'000)};
    // Sleeps only while the word still holds what was read: a raise in between wakes it.
    syscall(SYS_futex, event_word(file_->events_raised), FUTEX_WAIT,
            static_cast<std::uint32_t>(raised), &wait, nullptr, 0);
  }
}

}  // namespace tessera::sim
