#include "common/member_accounts.h"

#include <unistd.h>

#include <cstring>

#include "common/shared_file.h"

namespace tessera {
namespace {

constexpr std::uint32_t kMemberFree = 0;
constexpr std::uint32_t kMemberLive = 1;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

}  // namespace

void initialize_accounts(SharedAccounts& accounts) {
  std::memset(static_cast<void*>(&accounts), 0, sizeof accounts);
  initialize_robust_mutex(&accounts.lock);
}

bool accounts_look_valid(const SharedAccounts& accounts, int& bad_slot) {
  for (int slot = 0; slot < kMaxMembers; ++slot) {
    const std::uint32_t state = accounts.members[slot].state.load(std::memory_order_relaxed);
    if (state != kMemberFree && state != kMemberLive) {
      bad_slot = slot;
      return false;
    }
  }
  return true;
}

void MemberAccounts::lock() {
  if (lock_robust(&accounts_->lock) == LockOutcome::previous_owner_died) {
    accounts_->lock_recoveries.fetch_add(1, std::memory_order_relaxed);
    reap_dead_locked();
    rebuild_totals_locked();
  }
}

void MemberAccounts::reap_dead_locked() {
  for (int slot = 0; slot < kMaxMembers; ++slot) {
    MemberAccount& member = accounts_->members[slot];
    if (slot == my_slot_ || member.state.load(std::memory_order_relaxed) != kMemberLive) continue;
    if (liveness_lock_held_by_other(fd_, slot)) continue;
    for (int device = 0; device < kMaxDevices; ++device) {
      const std::uint64_t held = member.used[device].exchange(0, std::memory_order_relaxed);
      accounts_->used[device].fetch_sub(held, std::memory_order_relaxed);
    }
    member.pid = 0;
    member.state.store(kMemberFree, std::memory_order_release);
    accounts_->members_reclaimed.fetch_add(1, std::memory_order_relaxed);
  }
}

void MemberAccounts::rebuild_totals_locked() {
  for (int device = 0; device < kMaxDevices; ++device) {
    std::uint64_t total = 0;
    for (const MemberAccount& member : accounts_->members) {
      if (member.state.load(std::memory_order_relaxed) == kMemberLive) {
        total += member.used[device].load(std::memory_order_relaxed);
      }
    }
    accounts_->used[device].store(total, std::memory_order_relaxed);
  }
}

bool MemberAccounts::join(ErrorText& error) {
  if (my_slot_ >= 0) return true;
  lock();
  reap_dead_locked();
  for (int slot = 0; slot < kMaxMembers; ++slot) {
    MemberAccount& member = accounts_->members[slot];
    if (member.state.load(std::memory_order_relaxed) != kMemberFree) continue;
    if (!take_liveness_lock(fd_, slot)) continue;
    for (auto& used : member.used) used.store(0, std::memory_order_relaxed);
    member.pid = static_cast<std::int32_t>(getpid());
    member.state.store(kMemberLive, std::memory_order_release);
    my_slot_ = slot;
    unlock();
    return true;
  }
  unlock();
  return error.set("all %d member slots are held by live processes", kMaxMembers);
}

void MemberAccounts::leave() {
  if (my_slot_ < 0) return;
  MemberAccount& member = accounts_->members[my_slot_];
  lock();
  for (int device = 0; device < kMaxDevices; ++device) {
    const std::uint64_t held = member.used[device].exchange(0, std::memory_order_relaxed);
    accounts_->used[device].fetch_sub(held, std::memory_order_relaxed);
  }
  member.pid = 0;
  member.state.store(kMemberFree, std::memory_order_release);
  drop_liveness_lock(fd_, my_slot_);
  unlock();
  my_slot_ = -1;
}

bool MemberAccounts::reserve(int device, std::uint64_t bytes, std::uint64_t limit) {
  MemberAccount& member = accounts_->members[my_slot_];
  lock();
  std::uint64_t used = accounts_->used[device].load(std::memory_order_relaxed);
  if (limit != kUnlimited && (bytes > limit || used > limit - bytes)) {
    reap_dead_locked();  // refuse only on the word of live members
    used = accounts_->used[device].load(std::memory_order_relaxed);
    if (bytes > limit || used > limit - bytes) {
      accounts_->rejections[device].fetch_add(1, std::memory_order_relaxed);
      unlock();
      return false;
    }
  }
  member.used[device].fetch_add(bytes, std::memory_order_relaxed);
  used += bytes;
  accounts_->used[device].store(used, std::memory_order_relaxed);
  if (used > accounts_->peak[device].load(std::memory_order_relaxed)) {
    accounts_->peak[device].store(used, std::memory_order_relaxed);
  }
  unlock();
  return true;
}

void MemberAccounts::release(int device, std::uint64_t bytes) {
  MemberAccount& member = accounts_->members[my_slot_];
  lock();
  const std::uint64_t held = member.used[device].load(std::memory_order_relaxed);
  const std::uint64_t returned = bytes < held ? bytes : held;
  member.used[device].store(held - returned, std::memory_order_relaxed);
  accounts_->used[device].fetch_sub(returned, std::memory_order_relaxed);
  unlock();
}

AccountsUsage MemberAccounts::usage(int device) {
  lock();
  reap_dead_locked();
  AccountsUsage usage;
  usage.used = accounts_->used[device].load(std::memory_order_relaxed);
  usage.peak = accounts_->peak[device].load(std::memory_order_relaxed);
  usage.rejections = accounts_->rejections[device].load(std::memory_order_relaxed);
  unlock();
  return usage;
}

std::uint64_t MemberAccounts::member_used(int device) const {
  if (my_slot_ < 0) return 0;
  return accounts_->members[my_slot_].used[device].load(std::memory_order_relaxed);
}

int MemberAccounts::live_members() {
  lock();
  reap_dead_locked();
  int live = 0;
  for (const MemberAccount& member : accounts_->members) {
    if (member.state.load(std::memory_order_relaxed) == kMemberLive) ++live;
  }
  unlock();
  return live;
}

int MemberAccounts::live_pids(std::int32_t* pids, int capacity) {
  lock();
  reap_dead_locked();
  int count = 0;
  for (const MemberAccount& member : accounts_->members) {
    if (member.state.load(std::memory_order_relaxed) != kMemberLive) continue;
    if (count < capacity) pids[count] = member.pid;
    ++count;
  }
  unlock();
  return count;
}

int MemberAccounts::list_members(int device, std::int32_t* pids, std::uint64_t* used,
                                 int capacity) {
  lock();
  reap_dead_locked();
  int count = 0;
  for (const MemberAccount& member : accounts_->members) {
    if (member.state.load(std::memory_order_relaxed) != kMemberLive) continue;
    const std::uint64_t bytes = member.used[device].load(std::memory_order_relaxed);
    if (bytes == 0) continue;
    if (count < capacity) {
      pids[count] = member.pid;
      used[count] = bytes;
    }
    ++count;
  }
  unlock();
  return count;
}

}  // namespace tessera
