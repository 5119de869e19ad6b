// The ledger: one shared-memory file per sharing group, the single source of truth for the
// group's limits and each live member's device-memory usage. This module owns the format;
// the hook, `tessera run` and `tessera top` all go through it. The accounting itself,
// and its safety under kill -9, is common/member_accounts.h.
//
// Limits: the creator writes them once, under a checksum that every opener verifies, and a
// member keeps the limits it verified. It enforces the lower of those and the limits in its
// own environment, so writing the file cannot raise anyone's limit.
//
// Damage: a ledger written over, zeroed or truncated while members run is noticed at the
// next request (the header is no longer the one verified, or the accounts show what no
// member could have left; a truncation's SIGBUS is caught). From then on this process
// refuses every allocation and gives nothing back, and damage() says why.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/error_text.h"
#include "common/limits.h"
#include "common/member_accounts.h"
#include "common/priority.h"
#include "common/shared_file.h"

namespace tessera::ledger {

inline constexpr std::uint32_t kFormatVersion = 6;  // 3: priority; 4: slot bound; 5: held; 6: burst

struct LedgerFile {
  // Written once by the creator; covered by `checksum`.
  char magic[8];
  std::uint32_t version;
  std::uint32_t file_bytes;
  std::uint32_t max_devices;
  std::uint32_t max_members;
  char group_name[64];
  std::uint64_t memory_limit[kMostDevices];  // kUnlimited where none
  std::uint32_t core_percent[kMostDevices];  // compute share; 0 where none
  std::uint32_t priority;                    // a Priority
  std::uint32_t burst;                       // 1: may use device time no other group wants
  std::uint64_t checksum;

  // What a context was last measured to cost on each device: members charge this before
  // creating one, so the group is not over its limit while a context comes up.
  std::atomic<std::uint64_t> context_bytes[kMostDevices];
  // The group's pacing clock per device: when the device time it has been granted so far
  // will have been earned at its share (CLOCK_MONOTONIC ns). Shared by all members.
  std::atomic<std::uint64_t> compute_clock_ns[kMostDevices];
  std::atomic<std::uint64_t> throttled_ns[kMostDevices];    // time members waited for it
  std::atomic<std::uint64_t> held_ns[kMostDevices];         // time low-priority launches gave way
  std::atomic<std::uint64_t> device_time_ns[kMostDevices];  // device time granted to members
  SharedAccounts accounts;
};

struct GroupSpec {
  const char* name = "";
  DeviceLimits limits;
  Priority priority = Priority::none;
  bool burst = false;
};

struct DeviceUsage {
  std::uint64_t limit = kUnlimited;  // effective limit for this process
  std::uint32_t cores = 0;           // compute share, percent; 0: none
  std::uint64_t throttled_ns = 0;    // time members waited for their share
  std::uint64_t held_ns = 0;         // time low-priority launches gave way to high priority
  std::uint64_t device_time_ns = 0;  // device time the group's launches were granted
  std::uint64_t used = 0;            // group usage, dead members excluded
  std::uint64_t peak = 0;
  std::uint64_t rejections = 0;
};

class Ledger {
 public:
  Ledger() = default;
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;
  ~Ledger() { close(); }

  // Creates the group's ledger at path, or opens it if it exists with the same limits.
  bool create_or_open(const char* path, const GroupSpec& spec, ErrorText& error);
  // Opens an existing ledger; refuses one that is corrupt, truncated or foreign.
  bool open(const char* path, ErrorText& error);
  // create_or_open for `tessera run`: the file is kept in place (it is the same file that
  // the path names) until this Ledger closes or remove_if_unused.
  bool create_or_open_kept(const char* path, const GroupSpec& spec, ErrorText& error);
  // Removes the file if no other run keeps it and no member is live; closes the ledger.
  // True if it was removed.
  bool remove_if_unused(const char* path);
  // A ledger for this process tree alone (memfd), shared with forked children.
  bool create_private(const GroupSpec& spec, ErrorText& error);
  void close();
  bool is_open() const { return file_ != nullptr; }

  // Limits this process was given by its environment; enforced together with the file's.
  void set_process_limits(const DeviceLimits& limits) { process_limits_ = limits; }
  // The lower of the group's priority and this process's.
  Priority effective_priority(Priority process) const {
    return lower_priority(file_priority_, process);
  }
  Priority group_priority() const { return file_priority_; }
  // Whether the group may burst into device time no other group wants, as its creator said.
  bool group_bursts() const { return file_burst_; }
  std::uint64_t effective_limit(int device) const;
  std::uint32_t effective_cores(int device) const;

  // Grants cost_ns of device time at `percent` of the device; returns when the caller may
  // launch (at most `lead_ns` ahead of what that share has earned by then).
  std::uint64_t pace(int device, std::uint64_t cost_ns, std::uint64_t now_ns, std::uint64_t lead_ns,
                     std::uint32_t percent);
  void add_throttled(int device, std::uint64_t ns) {
    file_->throttled_ns[device].fetch_add(ns, std::memory_order_relaxed);
  }
  void add_held(int device, std::uint64_t ns) {
    file_->held_ns[device].fetch_add(ns, std::memory_order_relaxed);
  }

  // Claims a member slot for this process. Idempotent; must precede reserve().
  bool join(ErrorText& error);
  bool joined() const { return accounts_.joined(); }
  // Charges bytes to this member if the group stays within its limit on device.
  bool reserve(int device, std::uint64_t bytes) {
    return intact() && accounts_.reserve(device, bytes, effective_limit(device));
  }
  void release(int device, std::uint64_t bytes) {
    if (intact()) accounts_.release(device, bytes);
  }
  DeviceUsage usage(int device);  // all zero, but the limits, if damaged
  std::uint64_t member_used(int device) const { return accounts_.member_used(device); }
  int live_members() { return intact() ? accounts_.live_members() : -1; }  // -1: cannot tell
  int live_pids(std::int32_t* pids, int capacity) {
    return intact() ? accounts_.live_pids(pids, capacity) : 0;
  }
  // Why this ledger cannot be trusted any more, naming the file; nullptr while it can.
  const char* damage();
  std::uint64_t context_estimate(int device) const {
    return file_->context_bytes[device].load(std::memory_order_relaxed);
  }
  void learn_context_size(int device, std::uint64_t bytes) {
    file_->context_bytes[device].store(bytes, std::memory_order_relaxed);
  }

  // In a forked child: forget the parent's slot and take an own file description, so the
  // parent's liveness does not depend on the child. Async-signal-safe.
  void after_fork_in_child();

  const LedgerFile* file() const { return file_; }

 private:
  bool validate(const char* path, ErrorText& error) const;
  bool attach(const char* path, ErrorText& error);
  // The header is still the one validated at open.
  bool intact() const {
    return std::memcmp(file_, &verified_header_, sizeof verified_header_) == 0;
  }

  SharedMapping mapping_;
  LedgerFile* file_ = nullptr;
  MemberAccounts accounts_;
  DeviceLimits file_limits_;  // as validated at open: later writes to the file change nothing
  Priority file_priority_ = Priority::none;
  bool file_burst_ = false;
  DeviceLimits process_limits_;
  // The creator-written part of the file as validated, through the checksum.
  unsigned char verified_header_[offsetof(LedgerFile, checksum) + sizeof(std::uint64_t)] = {};
  char path_[256] = {};
  ErrorText damage_;
};

// FNV-1a over the creator-written part of the file.
std::uint64_t header_checksum(const LedgerFile& file);

}  // namespace tessera::ledger
