#include "simgpu/sim_machine.h"

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tessera::sim {
namespace {

constexpr char kMagic[8] = {'T', 'E', 'S', 'S', 'S', 'I', 'M', 'G'};
constexpr std::uint32_t kVersion = 1;

void initialize_file(void* base, const void* context) {
  auto* file = static_cast<MachineFile*>(base);
  std::memcpy(file->magic, kMagic, sizeof kMagic);
  file->version = kVersion;
  file->file_bytes = sizeof(MachineFile);
  std::memcpy(&file->spec, context, sizeof(MachineSpec));
  initialize_accounts(file->accounts);
  for (DeviceClock& clock : file->clocks) initialize_robust_mutex(&clock.lock);
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
    std::snprintf(path, sizeof path, "%s", explicit_path);
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
  accounts_.attach(&file->accounts, mapping_.fd);
  if (!accounts_.join(error)) {
    mapping_.close();
    return false;
  }
  file_ = file;
  return true;
}

void Machine::after_fork_in_child() {
  if (file_ == nullptr) return;
  mapping_.reopen_in_child();
  accounts_.forget_slot();  // the child joins on its first charge
}

bool Machine::charge(int device, std::uint64_t bytes) {
  ErrorText ignored;
  if (!accounts_.join(ignored)) return false;
  return accounts_.reserve(device, bytes, file_->spec.devices[device].memory_bytes);
}

std::uint64_t Machine::reach(int device, std::uint64_t* stream_tail) {
  DeviceClock& clock = file_->clocks[device];
  lock_robust(&clock.lock);
  std::uint64_t at = monotonic_ns();
  if (*stream_tail > at) at = *stream_tail;
  if (clock.busy_until_ns > at) at = clock.busy_until_ns;
  clock.busy_until_ns = at;
  *stream_tail = at;
  unlock_robust(&clock.lock);
  return at;
}

void Machine::occupy(int device, std::uint64_t* stream_tail, std::uint64_t duration_ns) {
  DeviceClock& clock = file_->clocks[device];
  lock_robust(&clock.lock);  // a dead owner leaves only whole 64-bit values behind
  std::uint64_t start = monotonic_ns();
  if (*stream_tail > start) start = *stream_tail;
  if (clock.busy_until_ns > start) start = clock.busy_until_ns;
  const std::uint64_t end = start + duration_ns;
  clock.busy_until_ns = end;
  *stream_tail = end;
  const std::uint64_t index = file_->timeline_head.fetch_add(1, std::memory_order_relaxed);
  TimelineEntry& entry = file_->timeline[index % kTimelineEntries];
  entry.sequence.store(0, std::memory_order_relaxed);
  entry.pid = static_cast<std::int32_t>(getpid());
  entry.device = device;
  entry.start_ns = start;
  entry.end_ns = end;
  entry.sequence.store(index + 1, std::memory_order_release);
  unlock_robust(&clock.lock);
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

BusyTime Machine::busy(int device, std::int32_t pid, std::uint64_t from_ns,
                       std::uint64_t to_ns) const {
  BusyTime busy;
  busy.complete = walk_record(*file_, from_ns, [&](const TimelineEntry& entry) {
    if (entry.device != device) return;
    const std::uint64_t start = entry.start_ns > from_ns ? entry.start_ns : from_ns;
    const std::uint64_t end = entry.end_ns < to_ns ? entry.end_ns : to_ns;
    if (end <= start) return;
    busy.device_ns += end - start;
    if (entry.pid == pid) busy.process_ns += end - start;
  });
  return busy;
}

int Machine::pieces(int device, std::int32_t pid, std::uint64_t from_ns, std::uint64_t to_ns,
                    WorkPiece* out, int capacity) const {
  int count = 0;
  const bool complete = walk_record(*file_, from_ns, [&](const TimelineEntry& entry) {
    if (entry.device != device || entry.pid != pid) return;
    if (entry.start_ns < from_ns || entry.start_ns >= to_ns) return;
    if (count < capacity) out[count] = {entry.start_ns, entry.end_ns};
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

}  // namespace tessera::sim
