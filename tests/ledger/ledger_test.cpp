// The ledger under real processes: exact limits, kill -9 at any instant, PID reuse, fork,
// and files that are corrupt, truncated, foreign or tampered with.
#include "ledger/ledger.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "ledger/demand.h"
#include "support.h"

namespace tessera::ledger {
namespace {

using test::ScratchDirectory;

GroupSpec spec_with_limit(std::uint64_t bytes) {
  GroupSpec spec;
  spec.name = "test";
  spec.limits.memory_bytes[0] = bytes;
  return spec;
}

// Creates a ledger at path with the given device-0 limit.
void create(const std::string& path, std::uint64_t limit) {
  Ledger ledger;
  ErrorText error;
  ASSERT_TRUE(ledger.create_or_open(path.c_str(), spec_with_limit(limit), error)) << error.text;
}

Ledger& joined(Ledger& ledger, const std::string& path) {
  ErrorText error;
  EXPECT_TRUE(ledger.open(path.c_str(), error)) << error.text;
  EXPECT_TRUE(ledger.join(error)) << error.text;
  return ledger;
}

// A child process that joins, reserves `bytes`, reports through a pipe, then waits to die.
pid_t member_holding(const std::string& path, std::uint64_t bytes) {
  int ready[2];
  EXPECT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    Ledger ledger;
    ErrorText error;
    if (!ledger.open(path.c_str(), error) || !ledger.join(error) || !ledger.reserve(0, bytes)) {
      _exit(1);
    }
    char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    for (;;) pause();
  }
  close(ready[1]);
  char byte = 0;
  EXPECT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  return pid;
}

void kill_and_reap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(Ledger, GrantsExactlyUpToTheLimit) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  Ledger ledger;
  joined(ledger, path);
  EXPECT_TRUE(ledger.reserve(0, 600));
  EXPECT_TRUE(ledger.reserve(0, 400));
  EXPECT_FALSE(ledger.reserve(0, 1));
  EXPECT_EQ(ledger.usage(0).used, 1000u);
  EXPECT_EQ(ledger.usage(0).rejections, 1u);
  ledger.release(0, 400);
  EXPECT_TRUE(ledger.reserve(0, 400));
  EXPECT_FALSE(ledger.reserve(0, UINT64_MAX));  // no overflow in the check
  EXPECT_TRUE(ledger.reserve(1, 1ull << 50));   // device 1 has no limit
}

TEST(Ledger, ReleaseNeverUnderflows) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  Ledger ledger;
  joined(ledger, path);
  ASSERT_TRUE(ledger.reserve(0, 100));
  ledger.release(0, 500);
  EXPECT_EQ(ledger.usage(0).used, 0u);
  EXPECT_EQ(ledger.member_used(0), 0u);
}

TEST(Ledger, ExistingGroupWithOtherLimitsIsRefused) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  Ledger ledger;
  ErrorText error;
  EXPECT_FALSE(ledger.create_or_open(path.c_str(), spec_with_limit(2000), error));
  EXPECT_NE(std::string(error.text).find("limit of 1000 bytes on device 0; this run asks for 2000"),
            std::string::npos)
      << error.text;
}

TEST(Ledger, TheGroupsPriorityIsRecordedAndALowerOneWins) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  GroupSpec spec = spec_with_limit(1000);
  spec.priority = Priority::low;
  Ledger created;
  ErrorText error;
  ASSERT_TRUE(created.create_or_open(path.c_str(), spec, error)) << error.text;
  Ledger member;
  ASSERT_TRUE(member.open(path.c_str(), error)) << error.text;
  EXPECT_EQ(member.group_priority(), Priority::low);
  // A member's environment cannot raise it, only lower it.
  EXPECT_EQ(member.effective_priority(Priority::high), Priority::low);
  EXPECT_EQ(member.effective_priority(Priority::none), Priority::low);
  spec.priority = Priority::high;
  Ledger other;
  EXPECT_FALSE(other.create_or_open(path.c_str(), spec, error));
  EXPECT_NE(std::string(error.text).find("group exists with priority low; this run asks for high"),
            std::string::npos)
      << error.text;
  EXPECT_EQ(lower_priority(Priority::high, Priority::none), Priority::high);
  EXPECT_EQ(lower_priority(Priority::none, Priority::none), Priority::none);
}

struct Damage {
  const char* name;
  void (*apply)(const std::string& path);
  const char* expected;
};

void patch(const std::string& path, std::size_t offset, const void* bytes, std::size_t size) {
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, bytes, size, static_cast<off_t>(offset)), static_cast<ssize_t>(size));
  close(fd);
}

const Damage kDamages[] = {
    {"bad magic", [](const std::string& p) { patch(p, 0, "NOTALEDG", 8); }, "not a Tessera ledger"},
    {"other version",
     [](const std::string& p) {
       const std::uint32_t version = 99;
       patch(p, offsetof(LedgerFile, version), &version, sizeof version);
     },
     "format version 99"},
    {"changed limit",
     [](const std::string& p) {
       const std::uint64_t limit = 1ull << 40;
       patch(p, offsetof(LedgerFile, memory_limit), &limit, sizeof limit);
     },
     "checksum mismatch"},
    {"truncated", [](const std::string& p) { ASSERT_EQ(truncate(p.c_str(), 100), 0); },
     "is 100 bytes, expected"},
    {"grown", [](const std::string& p) { ASSERT_EQ(truncate(p.c_str(), 1 << 20), 0); },
     "truncated, or not a Tessera file"},
    {"foreign text",
     [](const std::string& p) {
       std::ofstream(p, std::ios::trunc) << "hello, I am a config file\n";
     },
     "is 26 bytes"},
    {"bad member state",
     [](const std::string& p) {
       const std::uint32_t state = 7;
       patch(p,
             offsetof(LedgerFile, accounts) + offsetof(SharedAccounts, members) +
                 3 * sizeof(MemberAccount),
             &state, sizeof state);
     },
     "member slot 3 has an invalid state"},
};

TEST(Ledger, CorruptTruncatedAndForeignFilesAreRefusedWithAReason) {
  for (const Damage& damage : kDamages) {
    ScratchDirectory scratch;
    const std::string path = scratch.file("g.ledger");
    create(path, 1000);
    damage.apply(path);
    Ledger ledger;
    ErrorText error;
    EXPECT_FALSE(ledger.open(path.c_str(), error)) << damage.name;
    EXPECT_NE(std::string(error.text).find(damage.expected), std::string::npos)
        << damage.name << ": " << error.text;
    EXPECT_NE(std::string(error.text).find(path), std::string::npos) << damage.name;
  }
}

TEST(Ledger, WritingTheFileCannotRaiseALimit) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  Ledger member;
  joined(member, path);
  // A member forges a larger limit and even recomputes the checksum.
  {
    const int fd = open(path.c_str(), O_RDWR);
    auto* file = static_cast<LedgerFile*>(
        mmap(nullptr, sizeof(LedgerFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    file->memory_limit[0] = 1ull << 40;
    file->checksum = header_checksum(*file);
    munmap(file, sizeof(LedgerFile));
    close(fd);
  }
  EXPECT_FALSE(member.reserve(0, 1001));  // members keep the limit they verified
  // A newcomer is bound by the limit in its own environment, which the file cannot change.
  Ledger newcomer;
  joined(newcomer, path);
  DeviceLimits from_environment;
  from_environment.memory_bytes[0] = 1000;
  newcomer.set_process_limits(from_environment);
  EXPECT_FALSE(newcomer.reserve(0, 1001));
  EXPECT_TRUE(newcomer.reserve(0, 1000));
}

TEST(Ledger, AKilledMembersBytesAreReclaimedBeforeAnyRefusal) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  const pid_t child = member_holding(path, 700);
  Ledger ledger;
  joined(ledger, path);
  EXPECT_FALSE(ledger.reserve(0, 500));  // the child is alive and holds 700
  kill_and_reap(child);
  EXPECT_TRUE(ledger.reserve(0, 1000));  // reclaimed first, then granted in full
  EXPECT_EQ(ledger.usage(0).used, 1000u);
}

TEST(Ledger, PidReuseCannotKeepADeadEntryAlive) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  const pid_t child = member_holding(path, 700);
  kill_and_reap(child);
  // The dead member's slot now names a PID that is alive: this test process.
  {
    const int fd = open(path.c_str(), O_RDWR);
    auto* file = static_cast<LedgerFile*>(
        mmap(nullptr, sizeof(LedgerFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    bool found = false;
    for (MemberAccount& member : file->accounts.members) {
      if (member.pid == child) {
        member.pid = getpid();
        found = true;
      }
    }
    EXPECT_TRUE(found);
    munmap(file, sizeof(LedgerFile));
    close(fd);
  }
  Ledger ledger;
  joined(ledger, path);
  EXPECT_EQ(ledger.usage(0).used, 0u);
  EXPECT_TRUE(ledger.reserve(0, 1000));
}

TEST(Ledger, KillMinusNineInsideTheLockNeverHangsAndNeverLeaks) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1ull << 30);
  std::mt19937 random(42);
  Ledger observer;
  ErrorText error;
  ASSERT_TRUE(observer.open(path.c_str(), error)) << error.text;
  // At least 150 rounds, and on until a kill has landed inside the lock: on a busy host the
  // child's threads may be off the CPU at every one of the first 150 kills.
  constexpr int kLeastRounds = 150, kMostRounds = 3000;
  int round = 0;
  for (; round < kMostRounds; ++round) {
    if (round >= kLeastRounds && observer.file()->accounts.lock_recoveries.load() > 0) break;
    int joined_pipe[2];
    ASSERT_EQ(pipe(joined_pipe), 0);
    const pid_t child = fork();
    if (child == 0) {
      Ledger ledger;
      ErrorText child_error;
      if (!ledger.open(path.c_str(), child_error) || !ledger.join(child_error)) _exit(1);
      char byte = 1;
      if (write(joined_pipe[1], &byte, 1) != 1) _exit(1);
      auto churn = [&ledger](unsigned seed) {
        std::mt19937 local(seed);
        for (;;) {
          const std::uint64_t bytes = 1 + local() % (64 << 20);
          if (ledger.reserve(0, bytes)) ledger.release(0, bytes);
        }
      };
      std::thread second(churn, 2);
      churn(1);
    }
    close(joined_pipe[1]);
    char byte = 0;
    ASSERT_EQ(read(joined_pipe[0], &byte, 1), 1);
    close(joined_pipe[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 2000));
    kill_and_reap(child);
    // Whatever the child was doing, the group is whole again and nobody is stuck.
    ASSERT_EQ(observer.usage(0).used, 0u) << "round " << round;
  }
  EXPECT_GT(observer.file()->accounts.lock_recoveries.load(), 0u)
      << "no kill landed inside the lock in " << kMostRounds << " rounds";
  EXPECT_GE(observer.file()->accounts.members_reclaimed.load(), static_cast<std::uint64_t>(round));
}

TEST(Ledger, EightProcessesOfEightThreadsNeverExceedTheLimitByOneByte) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  constexpr std::uint64_t kLimit = 100 * 1000 * 1000;
  create(path, kLimit);
  std::vector<pid_t> children;
  for (int process = 0; process < 8; ++process) {
    const pid_t child = fork();
    if (child == 0) {
      Ledger ledger;
      ErrorText error;
      if (!ledger.open(path.c_str(), error) || !ledger.join(error)) _exit(1);
      std::atomic<bool> exceeded{false};
      std::vector<std::thread> threads;
      for (int thread = 0; thread < 8; ++thread) {
        threads.emplace_back([&, thread] {
          std::mt19937_64 random(static_cast<unsigned>(process * 100 + thread));
          std::vector<std::uint64_t> held;
          for (int i = 0; i < 4000; ++i) {
            if (!held.empty() && random() % 2 == 0) {
              ledger.release(0, held.back());
              held.pop_back();
            } else {
              const std::uint64_t bytes = 1 + random() % (10 * 1000 * 1000);
              if (ledger.reserve(0, bytes)) held.push_back(bytes);
            }
            if (ledger.file()->accounts.used[0].load() > kLimit) exceeded = true;
          }
          for (std::uint64_t bytes : held) ledger.release(0, bytes);
        });
      }
      for (auto& thread : threads) thread.join();
      _exit(exceeded ? 2 : 0);
    }
    children.push_back(child);
  }
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  Ledger observer;
  ErrorText error;
  ASSERT_TRUE(observer.open(path.c_str(), error));
  const DeviceUsage usage = observer.usage(0);
  EXPECT_LE(usage.peak, kLimit);
  EXPECT_GT(usage.peak, kLimit * 9 / 10);  // the limit was really contended
  EXPECT_GT(usage.rejections, 0u);
  EXPECT_EQ(usage.used, 0u);
}

TEST(Ledger, AForkedChildIsAMemberOfItsOwnAndOutlivesItsParent) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t parent = fork();
  if (parent == 0) {
    Ledger ledger;
    ErrorText error;
    if (!ledger.open(path.c_str(), error) || !ledger.join(error) || !ledger.reserve(0, 300))
      _exit(1);
    if (fork() == 0) {  // the grandchild keeps running after its parent is killed
      ledger.after_fork_in_child();
      if (!ledger.join(error) || !ledger.reserve(0, 200)) _exit(1);
      char byte = 1;
      if (write(ready[1], &byte, 1) != 1) _exit(1);
      for (;;) pause();
    }
    for (;;) pause();
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  Ledger observer;
  ErrorText error;
  ASSERT_TRUE(observer.open(path.c_str(), error));
  EXPECT_EQ(observer.usage(0).used, 500u);
  EXPECT_EQ(observer.live_members(), 2);
  kill_and_reap(parent);
  EXPECT_EQ(observer.usage(0).used, 200u);  // the parent's bytes, not the child's
  EXPECT_EQ(observer.live_members(), 1);
  // The grandchild is still alive (reparented); end it through the group.
  for (const MemberAccount& member : observer.file()->accounts.members) {
    if (member.state.load() == 1) kill(member.pid, SIGKILL);
  }
  close(ready[0]);
}

// Runs `body` in a forked child under an alarm; the child's exit status (or 128 + signal).
template <typename Body>
int in_child(Body body) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);  // a hang ends as a failure, not as a stuck suite
    _exit(body() ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

void overwrite(const std::string& path, std::size_t offset, unsigned char byte, std::size_t size) {
  const std::vector<unsigned char> bytes(size, byte);
  patch(path, offset, bytes.data(), bytes.size());
}
// Each locked step looks only at the slots below the bound, so the bound must cover every
// live member, however members come and go, and shrink again when the top ones have gone.
TEST(Ledger, TheSlotBoundCoversEveryLiveMemberAndShrinksWhenTheTopOnesGo) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  Ledger observer;
  ErrorText error;
  ASSERT_TRUE(observer.open(path.c_str(), error)) << error.text;
  const auto bound = [&] { return observer.file()->accounts.slot_bound.load(); };
  EXPECT_EQ(bound(), 0u);
  auto first = std::make_unique<Ledger>();
  auto second = std::make_unique<Ledger>();
  joined(*first, path);
  joined(*second, path);
  EXPECT_EQ(bound(), 2u);
  const pid_t top = member_holding(path, 300);  // slot 2
  EXPECT_EQ(bound(), 3u);
  EXPECT_FALSE(first->reserve(0, 701)) << "the member in the top slot was not counted";
  first.reset();  // slot 0 left: the bound stays, slots 1 and 2 are live
  EXPECT_EQ(bound(), 3u);
  kill_and_reap(top);
  EXPECT_EQ(observer.usage(0).used, 0u);  // reclaimed, and the bound lowered past it
  EXPECT_EQ(bound(), 2u);
  EXPECT_TRUE(second->reserve(0, 1000));
  second.reset();  // closed as at exit: the next locked step reclaims it
  EXPECT_EQ(observer.usage(0).used, 0u);
  EXPECT_EQ(bound(), 0u);
  Ledger late;
  joined(late, path);  // the lowest free slot again
  EXPECT_EQ(bound(), 1u);
  EXPECT_TRUE(late.reserve(0, 1000));
}

// A group of 1000 bytes in a scratch directory: one member holding 900, one holding none.
struct HeldGroup {
  ScratchDirectory scratch;
  std::string path = scratch.file("g.ledger");
  Ledger holder, newcomer;
  HeldGroup() {
    create(path, 1000);
    joined(holder, path);
    joined(newcomer, path);
    EXPECT_TRUE(holder.reserve(0, 900));
  }
};

TEST(Ledger, ALedgerZeroedUnderItsMembersGivesEachAClearErrorAndNeverMore) {
  HeldGroup group;
  auto& [scratch, path, holder, newcomer] = group;
  overwrite(path, 0, 0, sizeof(LedgerFile));  // as `dd if=/dev/zero conv=notrunc`
  EXPECT_FALSE(newcomer.reserve(0, 500)) << "the zeroed ledger lifted the limit";
  EXPECT_FALSE(holder.reserve(0, 50));
  for (Ledger* member : {&holder, &newcomer}) {
    ASSERT_NE(member->damage(), nullptr);
    EXPECT_NE(std::string(member->damage()).find(path), std::string::npos) << member->damage();
    EXPECT_EQ(member->usage(0).peak, 0u) << "a peak read from a zeroed file";
    EXPECT_EQ(member->usage(0).limit, 1000u);  // the limit verified at open still stands
  }
  ErrorText error;
  Ledger late;
  EXPECT_FALSE(late.open(path.c_str(), error));  // and nobody opens it afresh
}

TEST(Ledger, AccountsWrittenOverAreNoticedAndGrantNothingMore) {
  // Each damage leaves the header intact, so only the accounts can give it away.
  const std::size_t accounts = offsetof(LedgerFile, accounts);
  const std::size_t slot0 = accounts + offsetof(SharedAccounts, members);
  const struct {
    const char* name;
    std::size_t offset;
    unsigned char byte;
    std::size_t size;
    const char* expected;
  } damages[] = {
      {"lock type", accounts, 0xff, sizeof(pthread_mutex_t), "lock was written over"},
      {"total zeroed", accounts + offsetof(SharedAccounts, used), 0, 8, "not the sum"},
      {"holder's counter zeroed", slot0 + offsetof(MemberAccount, used), 0, 8, "not the sum"},
      {"holder's slot freed", slot0 + offsetof(MemberAccount, state), 0, 4, "not the sum"},
      {"holder's slot garbled", slot0 + offsetof(MemberAccount, state), 0x5a, 4, "no member"},
      {"slot bound past the slots", accounts + offsetof(SharedAccounts, slot_bound), 0xff, 4,
       "bound on the member slots"},
      {"slot bound below the members", accounts + offsetof(SharedAccounts, slot_bound), 0, 4,
       "bound on the member slots"},
  };
  for (const auto& damage : damages) {
    HeldGroup group;
    auto& [scratch, path, holder, newcomer] = group;
    overwrite(path, damage.offset, damage.byte, damage.size);
    // In a child: before its fix, a lock of another type aborted on a glibc assertion.
    const int status = in_child([&] {
      const bool granted = newcomer.reserve(0, 500);
      const char* why = newcomer.damage();
      std::fprintf(stderr, "%s: %s\n", damage.name, why == nullptr ? "(no damage seen)" : why);
      return !granted && why != nullptr && std::strstr(why, damage.expected) != nullptr &&
             std::strstr(why, path.c_str()) != nullptr;
    });
    EXPECT_EQ(status, 0) << damage.name;
  }
}

// Recovery from a lock whose owner died runs before the checks do: a bound written over then
// must still be damage, never a read past the accounts.
TEST(Ledger, ABoundWrittenOverWhileTheLocksOwnerIsDeadIsDamageNotACrash) {
  HeldGroup group;
  auto& [scratch, path, holder, newcomer] = group;
  // A process that takes the group's lock and dies holding it.
  ASSERT_EQ(in_child([&] {
              auto* file = const_cast<LedgerFile*>(holder.file());
              return pthread_mutex_lock(&file->accounts.lock.native) == 0;
            }),
            0);
  overwrite(path, offsetof(LedgerFile, accounts) + offsetof(SharedAccounts, slot_bound), 0xff, 4);
  const int status = in_child([&] {
    const bool granted = newcomer.reserve(0, 50);
    const char* why = newcomer.damage();
    std::fprintf(stderr, "%s\n", why == nullptr ? "(no damage seen)" : why);
    return !granted && why != nullptr && std::strstr(why, "bound on the member slots") != nullptr;
  });
  EXPECT_EQ(status, 0) << "128 + signal: the recovery read past the accounts";
  EXPECT_EQ(holder.file()->accounts.lock_recoveries.load(), 1u);  // the dead owner was seen
}

TEST(Ledger, RandomBytesWrittenIntoALedgerInUseNeverAbortAndNeverGrantMore) {
  std::mt19937 random(20261203);
  for (int round = 0; round < 200; ++round) {
    HeldGroup group;
    auto& [scratch, path, holder, newcomer] = group;
    // A span of 1 to 64 random bytes anywhere in the file, the lock word excepted: a lock
    // that no one will ever release makes each request wait out the lock's timeout, which
    // Ledger.ALockThatIsNeverReleasedRefusesWithinItsTimeout covers.
    std::size_t offset = 0, size = 0;
    do {
      size = 1 + random() % 64;
      offset = random() % (sizeof(LedgerFile) - size);
    } while (offset < offsetof(LedgerFile, accounts) + sizeof(pthread_mutex_t) &&
             offset + size > offsetof(LedgerFile, accounts));
    std::vector<unsigned char> bytes(size);
    for (auto& byte : bytes) byte = static_cast<unsigned char>(random());
    patch(path, offset, bytes.data(), bytes.size());
    const int status = in_child([&] {
      holder.usage(0);
      if (holder.reserve(0, 200)) return false;    // 1100 of 1000
      if (newcomer.reserve(0, 200)) return false;  // joined before the damage
      Ledger late;
      ErrorText error;
      if (!late.open(path.c_str(), error) || !late.join(error)) return true;
      return !late.reserve(0, 200);
    });
    EXPECT_EQ(status, 0) << size << " bytes at " << offset;
  }
}

TEST(Ledger, ALockThatIsNeverReleasedRefusesWithinItsTimeout) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  Ledger member;
  joined(member, path);
  // A lock word naming an owner that exists and never lets go: this test process.
  const auto owner = static_cast<std::uint32_t>(getpid());
  patch(path, offsetof(LedgerFile, accounts), &owner, sizeof owner);
  const int status = in_child([&] { return !member.reserve(0, 100); });
  EXPECT_EQ(status, 0) << "a request waited forever, or was granted without the lock";
}

TEST(Ledger, ALedgerTruncatedUnderAMemberIsDamageNotSigbus) {
  ScratchDirectory scratch;
  const std::string path = scratch.file("g.ledger");
  create(path, 1000);
  const int status = in_child([&] {
    Ledger member;
    ErrorText error;
    if (!member.open(path.c_str(), error) || !member.join(error) || !member.reserve(0, 100)) {
      return false;
    }
    if (truncate(path.c_str(), 0) != 0) return false;
    const bool granted = member.reserve(0, 100);
    member.release(0, 100);
    const DeviceUsage usage = member.usage(0);
    const char* why = member.damage();
    return !granted && usage.used == 0 && why != nullptr && std::strstr(why, path.c_str());
  });
  EXPECT_EQ(status, 0) << "128 + 7 is SIGBUS";
}

constexpr std::uint64_t kMs = 1'000'000;

// Two devices' keys, as CUDA and NVML name them.
const contract::DeviceKey kDevice = [] {
  contract::DeviceKey key;
  contract::device_key_from_uuid("GPU-00000000-1111-2222-3333-444444444444", key);
  return key;
}();
const contract::DeviceKey kOtherDevice = [] {
  contract::DeviceKey key;
  contract::device_key_from_uuid("MIG-aaaaaaaa-1111-2222-3333-444444444444", key);
  return key;
}();

std::string coordination_file(const ScratchDirectory& scratch, const contract::DeviceKey& key) {
  return scratch.file(std::string(key.text) + contract::kCoordinationSuffix);
}

Demand open_demand(const ScratchDirectory& scratch, std::uint64_t group,
                   const contract::DeviceKey& key = kDevice) {
  Demand demand;
  ErrorText error;
  EXPECT_TRUE(demand.open(coordination_file(scratch, key).c_str(), key, group, error))
      << error.text;
  return demand;
}

TEST(Demand, AGroupSeesOtherGroupsRecentLaunchesButNotItsOwn) {
  ScratchDirectory scratch;
  Demand first = open_demand(scratch, 11), member = open_demand(scratch, 11),
         other = open_demand(scratch, 22);
  const std::uint64_t now = 1000 * kMs;
  member.stamp(now);
  EXPECT_FALSE(first.others_active(now, 20 * kMs));  // its own group
  other.stamp(now);
  EXPECT_TRUE(first.others_active(now + 20 * kMs, 20 * kMs));
  EXPECT_FALSE(first.others_active(now + 21 * kMs, 20 * kMs));  // no longer wanted
  EXPECT_FALSE(open_demand(scratch, 11, kOtherDevice).others_active(now, 20 * kMs))
      << "another device's file";
  // A stamp from before a reboot lies in the future of the new clock: it is not demand.
  EXPECT_FALSE(first.others_active(now - 100'000 * kMs, 20 * kMs));
}

// A group is known in coordination files by its ledger: every member alike, wherever the file
// is mounted; another ledger is another group.
TEST(Demand, MembersOfOneLedgerAreOneGroup) {
  ScratchDirectory scratch;
  const std::string web = scratch.file("web.ledger"), batch = scratch.file("batch.ledger");
  std::ofstream(web) << "a";
  std::ofstream(batch) << "b";
  const std::uint64_t web_group = group_identity(web.c_str());
  EXPECT_NE(web_group, 0u);
  EXPECT_EQ(group_identity(web.c_str()), web_group);
  EXPECT_NE(group_identity(batch.c_str()), web_group);
  EXPECT_EQ(group_identity(scratch.file("missing.ledger").c_str()), 0u);
  Demand first = open_demand(scratch, web_group), second = open_demand(scratch, web_group),
         other = open_demand(scratch, group_identity(batch.c_str()));
  const std::uint64_t now = 1000 * kMs;
  second.stamp(now);
  EXPECT_FALSE(first.others_active(now, 20 * kMs));
  EXPECT_TRUE(other.others_active(now, 20 * kMs));
}

TEST(Demand, SlotsOfGroupsLongGoneAreReused) {
  ScratchDirectory scratch;
  const std::uint64_t then = 1000 * kMs;
  for (std::uint64_t group = 1; group <= kDemandSlots; ++group) {
    open_demand(scratch, group).stamp(then);
  }
  Demand late = open_demand(scratch, 9999), watcher = open_demand(scratch, 1);
  late.stamp(then + kMs);  // every slot is taken and recent: no room yet
  EXPECT_FALSE(watcher.others_active(then + kMs, kMs / 2));
  const std::uint64_t later = then + 61'000 * kMs;
  late.stamp(later);  // a minute on, a gone group's slot is taken over
  EXPECT_TRUE(watcher.others_active(later, 20 * kMs));
}

TEST(Demand, HighPriorityWorkQueuesBehindHighPriorityWorkStillPending) {
  ScratchDirectory scratch;
  Demand web = open_demand(scratch, 1), chat = open_demand(scratch, 2),
         batch = open_demand(scratch, 3);
  const std::uint64_t now = 200'000 * kMs;
  EXPECT_EQ(batch.high_work_until(now), 0u);  // none ever
  web.add_high_work(now, 2 * kMs, 10);
  chat.add_high_work(now + kMs, 3 * kMs, 10);  // starts when web's is done
  EXPECT_EQ(batch.high_work_until(now), now + 5 * kMs);
  EXPECT_EQ(batch.high_launch_cost(), 3 * kMs);                               // the latest launch's
  EXPECT_EQ(open_demand(scratch, 3, kOtherDevice).high_work_until(now), 0u);  // another device
  web.add_high_work(now + 9 * kMs, kMs, 10);  // the device was idle in between
  EXPECT_EQ(batch.high_work_until(now + 9 * kMs), now + 10 * kMs);
  // After a reboot the old time lies far in the new clock's future: it is not pending work.
  EXPECT_EQ(batch.high_work_until(now - 100'000 * kMs), 0u);
  chat.add_high_work(now - 100'000 * kMs, kMs, 10);
  EXPECT_EQ(batch.high_work_until(now - 100'000 * kMs), now - 99'999 * kMs);
}

// Long low-priority work goes only where it ends before high-priority work's next launch,
// judged by the shortest recent gap that lasted as long as this one has.
TEST(Demand, LongLowPriorityWorkIsPlacedOnlyIntoAGapItFits) {
  ScratchDirectory scratch;
  Demand interactive = open_demand(scratch, 1), batch = open_demand(scratch, 2),
         other_batch = open_demand(scratch, 3);
  std::uint64_t now = 300'000 * kMs;
  // 1 ms of work, then 1 ms idle, and again.
  for (int i = 0; i <= Demand::kMinLongerGaps; ++i) {  // the first launch follows no gap
    if (i % 50 == 0) {
      EXPECT_FALSE(batch.place_low_work(now, now, kMs / 10, 0).placed) << "at launch " << i;
    }
    interactive.add_high_work(now, kMs, 15);
    now += 2 * kMs;
  }
  EXPECT_EQ(batch.high_tolerance_percent(), 15u);
  const std::uint64_t idle_since = now - kMs;  // the last launch's work was to end then
  EXPECT_TRUE(batch.place_low_work(idle_since, idle_since, kMs / 2, 0).placed);
  // Placed work counts: the next must follow it, and the gap holds no more than 1 ms.
  EXPECT_FALSE(other_batch.place_low_work(idle_since, idle_since, kMs * 6 / 10, 0).placed);
  EXPECT_TRUE(other_batch.place_low_work(idle_since, idle_since, kMs * 4 / 10, 0).placed);
  EXPECT_FALSE(batch.place_low_work(idle_since + kMs / 2, idle_since, kMs / 5, 0).placed);
  EXPECT_FALSE(batch.place_low_work(idle_since, idle_since + 2 * kMs, 3 * kMs, 0).placed)
      << "longer than any gap seen";
  // A gap longer than every one seen: nothing says when the next launch comes.
  EXPECT_FALSE(batch.place_low_work(idle_since + 3 * kMs, idle_since, kMs / 10, 0).placed);
  EXPECT_FALSE(open_demand(scratch, 2, kOtherDevice)
                   .place_low_work(idle_since, idle_since, kMs / 10, 0)
                   .placed)
      << "another device";
  // A few 5 ms gaps say little of the next; once most recent gaps were that long, work
  // started 2 ms into a gap may run to its fifth.
  std::uint64_t next_idle = now - kMs;
  for (int i = 0; i < Demand::kMinLongerGaps; ++i) {
    if (i % 50 == 0) {
      EXPECT_FALSE(batch.place_low_work(next_idle + 2 * kMs, next_idle, 2 * kMs, 0).placed)
          << "after " << i << " long gaps";
    }
    interactive.add_high_work(next_idle + 5 * kMs, kMs, 15);
    next_idle += 6 * kMs;
  }
  EXPECT_TRUE(batch.place_low_work(next_idle + 2 * kMs, next_idle, 2 * kMs, 0).placed);
  // One gap that ended early among them, and the same work no longer fits.
  interactive.add_high_work(next_idle + 3 * kMs, kMs, 15);
  next_idle += 4 * kMs;
  EXPECT_FALSE(batch.place_low_work(next_idle + 2 * kMs, next_idle, 2 * kMs, 0).placed);
}

// Short low-priority work of every group queues on one timeline, whose length is bounded: a
// high-priority launch waits for no more than the bound, however many groups there are.
TEST(Demand, LowPriorityGroupsShareOneBoundedQueue) {
  ScratchDirectory scratch;
  Demand interactive = open_demand(scratch, 1), batch = open_demand(scratch, 2),
         other_batch = open_demand(scratch, 3);
  const std::uint64_t now = 400'000 * kMs, idle_since = now - kMs / 10;
  constexpr std::uint64_t kUs = kMs / 1000;
  interactive.add_high_work(now - kMs, kMs - kMs / 10, 10);  // no gaps learned yet
  const Demand::LowPlacement first = batch.place_low_work(now, idle_since, 20 * kUs, 50 * kUs);
  EXPECT_TRUE(first.placed);
  EXPECT_EQ(first.launch_by, UINT64_MAX) << "a late queued launch queues behind less";
  EXPECT_TRUE(other_batch.place_low_work(now, idle_since, 20 * kUs, 50 * kUs).placed);
  // 40 us queued by the two groups: 20 more would make 60.
  const Demand::LowPlacement full = batch.place_low_work(now, idle_since, 20 * kUs, 50 * kUs);
  EXPECT_FALSE(full.placed);
  EXPECT_EQ(full.retry_at, now + 10 * kUs) << "when the queue has run down to room for it";
  EXPECT_TRUE(batch.place_low_work(now + 10 * kUs, idle_since, 20 * kUs, 50 * kUs).placed);
  // Longer than the queue holds, and no gap learned: never placed, and no time to come back.
  const Demand::LowPlacement long_work =
      other_batch.place_low_work(now + 100 * kUs, idle_since, 60 * kUs, 50 * kUs);
  EXPECT_FALSE(long_work.placed);
  EXPECT_EQ(long_work.retry_at, 0u);
  Demand elsewhere = open_demand(scratch, 2, kOtherDevice);
  EXPECT_FALSE(elsewhere.place_low_work(now, idle_since, 60 * kUs, 50 * kUs).placed)
      << "another device, the same bound";
  EXPECT_TRUE(elsewhere.place_low_work(now, idle_since, 20 * kUs, 50 * kUs).placed)
      << "another device's queue is its own";
}

// Work placed in a gap must reach the device in time to end before the gap's end.
TEST(Demand, WorkPlacedInAGapMustLaunchBeforeItNoLongerFits) {
  ScratchDirectory scratch;
  Demand interactive = open_demand(scratch, 1), batch = open_demand(scratch, 2);
  std::uint64_t now = 500'000 * kMs;
  for (int i = 0; i <= Demand::kMinLongerGaps; ++i) {  // 1 ms of work, then 1 ms idle
    interactive.add_high_work(now, kMs, 10);
    now += 2 * kMs;
  }
  const std::uint64_t idle_since = now - kMs;
  const Demand::LowPlacement placed =
      batch.place_low_work(idle_since + kMs / 10, idle_since, kMs / 2, 0);
  ASSERT_TRUE(placed.placed);
  EXPECT_EQ(placed.launch_by, idle_since + kMs / 2) << "1 ms gap, 0.5 ms of work";
  // The next follows it, and has less time to reach the device.
  const Demand::LowPlacement next =
      batch.place_low_work(idle_since + kMs / 10, idle_since, kMs / 4, 0);
  ASSERT_TRUE(next.placed);
  EXPECT_EQ(next.launch_by, idle_since + 3 * kMs / 4);
}

// Every opener verifies the header: a file that is not a coordination file, another device's,
// or one whose header was written over is refused, naming the file and the fault.
TEST(Demand, AFileThatIsNotThisDevicesCoordinationFileIsRefusedSayingWhy) {
  ScratchDirectory scratch;
  const std::string path = coordination_file(scratch, kDevice);
  Demand demand;
  ErrorText error;
  auto refusal = [&] {
    EXPECT_FALSE(demand.open(path.c_str(), kDevice, 1, error));
    EXPECT_NE(std::string(error.text).find(path), std::string::npos) << error.text;
    return std::string(error.text);
  };
  std::ofstream(path) << std::string(sizeof(DemandFile), 'x');
  EXPECT_NE(refusal().find("not a coordination file"), std::string::npos);
  std::filesystem::remove(path);
  open_demand(scratch, 1, kOtherDevice);  // made for another device, then named as this one
  std::filesystem::rename(coordination_file(scratch, kOtherDevice), path);
  EXPECT_NE(refusal().find("of another device"), std::string::npos);
  std::filesystem::remove(path);
  open_demand(scratch, 1);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(offsetof(DemandHeader, device));
    file << "ffff";  // another device's key, without its checksum
  }
  EXPECT_NE(refusal().find("fails its checksum"), std::string::npos);
  std::ofstream(path, std::ios::trunc) << "short";
  EXPECT_NE(refusal().find("bytes"), std::string::npos);
}

// The node agent makes each device's file, and makes whole one written over or cut short, in
// place: groups that have it mapped (containers that have it mounted) find it whole again.
TEST(Demand, AFileWrittenOverOrCutShortIsMadeWholeInPlaceForItsUsers) {
  ScratchDirectory scratch;
  const std::string path = coordination_file(scratch, kDevice);
  bool repaired = true;
  ErrorText error;
  ASSERT_TRUE(prepare_coordination_file(path.c_str(), kDevice, repaired, error)) << error.text;
  EXPECT_FALSE(repaired) << "made new, not repaired";
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                std::filesystem::perms::group_read | std::filesystem::perms::group_write |
                std::filesystem::perms::others_read | std::filesystem::perms::others_write);
  Demand user = open_demand(scratch, 7), other = open_demand(scratch, 8);
  struct stat before {};
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  std::ofstream(path, std::ios::in | std::ios::out | std::ios::binary) << "garbage!";
  EXPECT_FALSE(user.intact());
  ASSERT_TRUE(prepare_coordination_file(path.c_str(), kDevice, repaired, error)) << error.text;
  EXPECT_TRUE(repaired);
  EXPECT_TRUE(user.intact()) << "the header written anew where it was";
  other.stamp(1000 * kMs);
  EXPECT_TRUE(user.others_active(1000 * kMs, kMs)) << "still one file between them";
  // Cut short under its users: a user's next look sees zeroes, and its repair restores the
  // file's size and header in place, for both.
  ASSERT_EQ(truncate(path.c_str(), 0), 0);
  EXPECT_FALSE(user.intact());
  ASSERT_TRUE(user.repair(error)) << error.text;
  EXPECT_TRUE(user.intact());
  EXPECT_TRUE(other.intact());
  struct stat after {};
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the same file, so mounts of it see the repair";
  EXPECT_EQ(static_cast<std::size_t>(after.st_size), sizeof(DemandFile));
  other.stamp(2000 * kMs);
  EXPECT_TRUE(user.others_active(2000 * kMs, kMs));
}

}  // namespace
}  // namespace tessera::ledger
