#include "common/member_accounts.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "common/shared_file.h"

namespace tessera {
namespace {

constexpr std::uint32_t kMemberFree = 0;
constexpr std::uint32_t kMemberLive = 1;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

// A live member holds the lock for microseconds; one that holds it for this long is stopped,
// or the lock word was written over.
constexpr int kLockTimeoutMs = 5000;

}  // namespace

void initialize_accounts(SharedAccounts& accounts) {
  std::memset(static_cast<void*>(&accounts), 0, sizeof accounts);
  initialize_robust_mutex(&accounts.lock);
}

bool accounts_look_valid(const SharedAccounts& accounts, int& bad_slot) {
  for (int slot = 0; slot < kMostMembers; ++slot) {
    const std::uint32_t state = accounts.members[slot].state.load(std::memory_order_relaxed);
    if (state != kMemberFree && state != kMemberLive) {
      bad_slot = slot;
      return false;
    }
  }
  return true;
}

// Its outcome is one the analysis cannot follow (common/shared_file.h).
bool MemberAccounts::lock() NO_THREAD_SAFETY_ANALYSIS {
  if (damage_ != nullptr) return false;
  if (!robust_mutex_intact(&accounts_->lock)) {
    damage_ = "its lock was written over";
    return false;
  }
  switch (lock_robust(&accounts_->lock, kLockTimeoutMs)) {
    case LockOutcome::acquired:
      return true;
    case LockOutcome::previous_owner_died:
      accounts_->lock_recoveries.fetch_add(1, std::memory_order_relaxed);
      reap_dead_locked();
      rebuild_totals_locked();
      return true;
    case LockOutcome::timed_out:
      return false;  // this request is refused; the next one tries again
    case LockOutcome::failed:
      damage_ = "its lock cannot be taken (not recoverable, or claimed by this very thread)";
      return false;
  }
  return false;
}

bool MemberAccounts::sound_locked(int device) {
  const std::uint32_t bound = accounts_->slot_bound.load(std::memory_order_relaxed);
  if (bound > kMostMembers || (my_slot_ >= 0 && static_cast<std::uint32_t>(my_slot_) >= bound)) {
    damage_ = "its bound on the member slots in use was written over";
    return false;
  }
  std::uint64_t total = 0;
  for (std::uint32_t slot = 0; slot < bound; ++slot) {
    const MemberAccount& member = accounts_->members[slot];
    const std::uint32_t state = member.state.load(std::memory_order_relaxed);
    if (state != kMemberFree && state != kMemberLive) {
      damage_ = "a member slot is in a state no member could have left";
      return false;
    }
    if (device >= 0 && state == kMemberLive) {
      total += member.used[device].load(std::memory_order_relaxed);
    }
  }
  if (device >= 0 && total != accounts_->used[device].load(std::memory_order_relaxed)) {
    damage_ = "the group's total is not the sum of its members' counters";
    return false;
  }
  if (my_slot_ >= 0) {
    const MemberAccount& me = accounts_->members[my_slot_];
    if (me.state.load(std::memory_order_relaxed) != kMemberLive) {
      damage_ = "this member's slot was freed by something else";
      return false;
    }
    // The device this step touches (each device is checked when it is touched), or all.
    const int first = device >= 0 ? device : 0, last = device >= 0 ? device : kMostDevices - 1;
    for (int d = first; d <= last; ++d) {
      if (me.used[d].load(std::memory_order_relaxed) != my_used_[d]) {
        damage_ = "this member's counters were changed by something else";
        return false;
      }
    }
  }
  return true;
}

bool MemberAccounts::checked_lock(int device) {
  if (!lock()) return false;
  if (sound_locked(device)) return true;
  unlock();
  return false;
}

template <typename Visit>
void MemberAccounts::for_each_live_locked(Visit visit) {
  const int slots = slots_locked();
  for (int slot = 0; slot < slots; ++slot) {
    MemberAccount& member = accounts_->members[slot];
    if (member.state.load(std::memory_order_relaxed) == kMemberLive) visit(slot, member);
  }
}

void MemberAccounts::reap_dead_locked() {
  for_each_live_locked([this](int slot, MemberAccount& member) {
    if (slot == my_slot_ || liveness_lock_held_by_other(fd_, lock_base_ + slot)) return;
    for (int device = 0; device < kMostDevices; ++device) {
      const std::uint64_t held = member.used[device].exchange(0, std::memory_order_relaxed);
      accounts_->used[device].fetch_sub(held, std::memory_order_relaxed);
    }
    member.pid = 0;
    member.state.store(kMemberFree, std::memory_order_release);
    accounts_->members_reclaimed.fetch_add(1, std::memory_order_relaxed);
  });
  lower_slot_bound_locked();
}

void MemberAccounts::lower_slot_bound_locked() {
  std::uint32_t bound = accounts_->slot_bound.load(std::memory_order_relaxed);
  if (bound > kMostMembers) return;  // written over: left for sound_locked to call damage
  while (bound > 0 &&
         accounts_->members[bound - 1].state.load(std::memory_order_relaxed) == kMemberFree) {
    --bound;
  }
  accounts_->slot_bound.store(bound, std::memory_order_relaxed);
}

void MemberAccounts::rebuild_totals_locked() {
  std::uint64_t totals[kMostDevices] = {};
  for_each_live_locked([&totals](int, const MemberAccount& member) {
    for (int device = 0; device < kMostDevices; ++device) {
      totals[device] += member.used[device].load(std::memory_order_relaxed);
    }
  });
  for (int device = 0; device < kMostDevices; ++device) {
    accounts_->used[device].store(totals[device], std::memory_order_relaxed);
  }
}

bool MemberAccounts::join(ErrorText& error) {
  if (my_slot_ >= 0) return true;
  if (!checked_lock(-1)) {
    return error.set("the group's accounts %s",
                     damage_ != nullptr ? damage_ : "are locked by a member that does not let go");
  }
  reap_dead_locked();
  for (int slot = 0; slot < kMostMembers; ++slot) {
    MemberAccount& member = accounts_->members[slot];
    if (member.state.load(std::memory_order_relaxed) != kMemberFree) continue;
    if (!take_liveness_lock(fd_, lock_base_ + slot)) continue;
    for (auto& used : member.used) used.store(0, std::memory_order_relaxed);
    member.pid = static_cast<std::int32_t>(getpid());
    if (slot >= slots_locked()) {  // first: a joiner killed here leaves only a free slot below
      accounts_->slot_bound.store(static_cast<std::uint32_t>(slot) + 1, std::memory_order_relaxed);
    }
    member.state.store(kMemberLive, std::memory_order_release);
    my_slot_ = slot;
    for (auto& bytes : my_used_) bytes = 0;
    unlock();
    return true;
  }
  unlock();
  return error.set("all %d member slots are held by live processes", kMostMembers);
}

void MemberAccounts::leave() {
  if (my_slot_ < 0) return;
  MemberAccount& member = accounts_->members[my_slot_];
  if (checked_lock(-1)) {
    for (int device = 0; device < kMostDevices; ++device) {
      const std::uint64_t held = member.used[device].exchange(0, std::memory_order_relaxed);
      accounts_->used[device].fetch_sub(held, std::memory_order_relaxed);
    }
    member.pid = 0;
    member.state.store(kMemberFree, std::memory_order_release);
    lower_slot_bound_locked();
    unlock();
  }
  // Damaged or not, this process is no longer a member: others may reclaim the slot.
  drop_liveness_lock(fd_, lock_base_ + my_slot_);
  forget_slot();
}

bool MemberAccounts::reserve(int device, std::uint64_t bytes, std::uint64_t limit) {
  MemberAccount& member = accounts_->members[my_slot_];
  if (!checked_lock(device)) return false;
  std::uint64_t used = accounts_->used[device].load(std::memory_order_relaxed);
  const auto fits = [&] {
    return used <= UINT64_MAX - bytes &&
           (limit == kUnlimited || (bytes <= limit && used <= limit - bytes));
  };
  if (!fits()) {
    reap_dead_locked();  // refuse only on the word of live members
    used = accounts_->used[device].load(std::memory_order_relaxed);
    if (!fits()) {
      accounts_->rejections[device].fetch_add(1, std::memory_order_relaxed);
      unlock();
      return false;
    }
  }
  member.used[device].fetch_add(bytes, std::memory_order_relaxed);
  my_used_[device] += bytes;
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
  if (!checked_lock(device)) return;  // damaged: what is held stays charged
  const std::uint64_t held = member.used[device].load(std::memory_order_relaxed);
  const std::uint64_t returned = bytes < held ? bytes : held;
  member.used[device].store(held - returned, std::memory_order_relaxed);
  my_used_[device] = held - returned;
  accounts_->used[device].fetch_sub(returned, std::memory_order_relaxed);
  unlock();
}

AccountsUsage MemberAccounts::usage(int device) {
  AccountsUsage usage;
  if (!checked_lock(device)) return usage;
  reap_dead_locked();
  usage.used = accounts_->used[device].load(std::memory_order_relaxed);
  usage.peak = accounts_->peak[device].load(std::memory_order_relaxed);
  usage.rejections = accounts_->rejections[device].load(std::memory_order_relaxed);
  unlock();
  return usage;
}

std::uint64_t MemberAccounts::member_used(int device) const {
  return my_slot_ < 0 ? 0 : my_used_[device];
}

int MemberAccounts::live_members() {
  if (!checked_lock(-1)) return -1;
  reap_dead_locked();
  int live = 0;
  for_each_live_locked([&live](int, const MemberAccount&) { ++live; });
  unlock();
  return live;
}

int MemberAccounts::live_pids(std::int32_t* pids, int capacity) {
  if (!checked_lock(-1)) return 0;
  reap_dead_locked();
  int count = 0;
  for_each_live_locked([&](int, const MemberAccount& member) {
    if (count < capacity) pids[count] = member.pid;
    ++count;
  });
  unlock();
  return count;
}

int MemberAccounts::list_members(int device, std::int32_t* pids, std::uint64_t* used,
                                 int capacity) {
  if (!checked_lock(device)) return 0;
  reap_dead_locked();
  int count = 0;
  for_each_live_locked([&](int, const MemberAccount& member) {
    const std::uint64_t bytes = member.used[device].load(std::memory_order_relaxed);
    if (bytes == 0) return;
    if (count < capacity) {
      pids[count] = member.pid;
      used[count] = bytes;
    }
    ++count;
  });
  unlock();
  return count;
}

}  // namespace tessera
