// Per-member, per-device byte counters shared by many processes through a mapped file,
// with a capacity check that is exact under concurrency and survives kill -9 of any member
// at any instant. The ledger (group quotas) and the simulated GPU (device capacity) both
// keep their accounts this way; each owns the file format around it.
//
// - Every update runs under a robust process-shared mutex. A locker that finds the
//   previous owner dead reclaims dead members and rebuilds the totals from the live
//   members' own counters, which only their owners ever change.
// - Each member holds a liveness lock (common/shared_file.h) that the kernel drops at
//   death or exec, so a dead member is recognised whatever its PID now names. Dead
//   members' bytes are reclaimed before any request is refused and before usage is read.
// - Anything may write the file. Every locked step first checks what no member could have
//   left (a lock of another type, a slot in no known state, a total that is not the sum of
//   the members' counters, this member's own counters changed behind its back); on the
//   first such sign the accounts are damaged for this process: every later request is
//   refused and nothing is given back, so damage never grants more.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "common/error_text.h"
#include "common/limits.h"
#include "common/shared_file.h"

namespace tessera {

inline constexpr int kMostMembers = 256;

struct MemberAccount {
  std::atomic<std::uint32_t> state;  // kMemberFree or kMemberLive
  std::int32_t pid;                  // for display only; liveness is the lock
  std::atomic<std::uint64_t> used[kMostDevices];
};

struct SharedAccounts {
  alignas(64) RobustMutex lock;
  alignas(64) std::atomic<std::uint64_t> used[kMostDevices];  // sum over live members
  std::atomic<std::uint64_t> peak[kMostDevices];
  std::atomic<std::uint64_t> rejections[kMostDevices];
  std::atomic<std::uint64_t> members_reclaimed;
  std::atomic<std::uint64_t> lock_recoveries;
  // Every live member's slot lies below this (at most kMostMembers): each locked step checks
  // only those slots, so its cost follows the members there are, not the slots there could be.
  std::atomic<std::uint32_t> slot_bound;
  MemberAccount members[kMostMembers];
};

struct AccountsUsage {
  std::uint64_t used = 0;
  std::uint64_t peak = 0;
  std::uint64_t rejections = 0;
};

// Zeroes and initialises accounts placed in a fresh shared file.
void initialize_accounts(SharedAccounts& accounts);
// False if any member slot holds a state no writer could have left.
bool accounts_look_valid(const SharedAccounts& accounts, int& bad_slot);

// One process's handle on the accounts in a mapped file whose descriptor is `fd`.
class MemberAccounts {
 public:
  // Several accounts may share one file: each then names its own range of liveness locks,
  // `lock_base` upward (kMostMembers of them).
  void attach(SharedAccounts* accounts, int fd, int lock_base = 0) {
    accounts_ = accounts;
    fd_ = fd;
    lock_base_ = lock_base;
    damage_ = nullptr;
    forget_slot();
  }
  void detach() { attach(nullptr, -1, 0); }

  bool join(ErrorText& error);  // idempotent
  bool joined() const { return my_slot_ >= 0; }
  // Gives back everything this member holds and frees its slot (a clean exit).
  void leave();

  // Charges bytes to this member if the total stays within limit (kUnlimited: always).
  bool reserve(int device, std::uint64_t bytes, std::uint64_t limit);
  // Returns up to bytes of what this member holds; never underflows.
  void release(int device, std::uint64_t bytes);
  AccountsUsage usage(int device);  // reclaims dead members first; zeroes if damaged
  std::uint64_t member_used(int device) const;
  int live_members();  // -1: cannot tell (damaged, or the lock not had)
  // Fills pids with the live members' PIDs; returns how many there are.
  int live_pids(std::int32_t* pids, int capacity);
  // Fills pids/used (for NVML's process list) with live members holding bytes on device.
  int list_members(int device, std::int32_t* pids, std::uint64_t* used, int capacity);

  // In a forked child: forget the parent's slot; call after the descriptor was given a
  // description of its own. Async-signal-safe.
  void forget_slot() {
    my_slot_ = -1;
    for (auto& bytes : my_used_) bytes = 0;
  }

  // Why the accounts were found damaged (nullptr while they look sound).
  const char* damage() const { return damage_; }

  const SharedAccounts* shared() const { return accounts_; }

 private:
  // False (the lock not held) if the accounts are damaged or the lock cannot be had.
  [[nodiscard]] bool lock() TRY_ACQUIRE(true, accounts_->lock);
  void unlock() RELEASE(accounts_->lock) { unlock_robust(&accounts_->lock); }
  // Marks the damage when it finds some.
  bool sound_locked(int device) REQUIRES(accounts_->lock);
  // lock() and sound_locked(device) (-1: no device's total); false with the lock not held.
  [[nodiscard]] bool checked_lock(int device) TRY_ACQUIRE(true, accounts_->lock);
  // The live members' slots, [0, slot_bound), never past the array (sound_locked calls a
  // larger bound damage; recovery from a dead owner runs before that check).
  int slots_locked() const {
    const std::uint32_t bound = accounts_->slot_bound.load(std::memory_order_relaxed);
    return bound < kMostMembers ? static_cast<int>(bound) : kMostMembers;
  }
  // Calls visit(slot, member) for each live member below the bound.
  template <typename Visit>
  void for_each_live_locked(Visit visit);
  void reap_dead_locked() REQUIRES(accounts_->lock);
  void lower_slot_bound_locked() REQUIRES(accounts_->lock);  // past the free slots at the top
  void rebuild_totals_locked() REQUIRES(accounts_->lock);

  SharedAccounts* accounts_ = nullptr;
  int fd_ = -1;
  int lock_base_ = 0;
  int my_slot_ = -1;
  std::uint64_t my_used_[kMostDevices] = {};  // what this member holds, as it knows it
  const char* damage_ = nullptr;
};

}  // namespace tessera
