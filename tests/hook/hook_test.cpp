// The hook in real processes on the simulated GPU: every allocation path under and over
// the quota, every way of finding the driver, the views, fork, exec, concurrency, kill -9,
// and bad configuration.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>

#include "common/member_accounts.h"
#include "contract/layout.h"
#include "contract/variables.h"
#include "ledger/ledger.h"
#include "simgpu/sim_machine.h"
#include "support.h"

namespace tessera::test {
namespace {

constexpr std::uint64_t kLimit = kGiB;

Environment limited(const ScratchDirectory& scratch, const Environment& extra = {}) {
  Environment environment = hooked(scratch, extra);
  environment.emplace(contract::kMemoryLimitVariable, "1GiB");
  return environment;
}

// The simulated device's own record of device 0 (as the workers in `environment` see it):
// the most memory ever in use, and what is in use now.
AccountsUsage simulated_device(const Environment& environment) {
  // Attach with the workers' settings, and leave this process's environment as it was.
  const char* variables[] = {"TESSERA_SIM_STATE", "TESSERA_SIM_DEVICES"};
  std::string saved[2];
  bool was_set[2];
  for (int i = 0; i < 2; ++i) {
    const char* current = std::getenv(variables[i]);
    was_set[i] = current != nullptr;
    if (was_set[i]) saved[i] = current;
    const auto found = environment.find(variables[i]);
    if (found != environment.end()) {
      setenv(variables[i], found->second.c_str(), 1);
    } else {
      unsetenv(variables[i]);
    }
  }
  ErrorText error;
  sim::Machine machine;
  const bool attached = machine.attach(error);
  for (int i = 0; i < 2; ++i) {
    if (was_set[i]) {
      setenv(variables[i], saved[i].c_str(), 1);
    } else {
      unsetenv(variables[i]);
    }
  }
  if (!attached) {
    ADD_FAILURE() << error.text;
    return {};
  }
  return {machine.used(0), machine.peak(0), 0};
}

std::string make_group(const ScratchDirectory& scratch, std::uint64_t limit) {
  const std::string path = scratch.file(contract::kLedgerFileName);
  ledger::GroupSpec spec;
  spec.name = "group";
  spec.limits.memory_bytes[0] = limit;
  ledger::Ledger ledger;
  ErrorText error;
  EXPECT_TRUE(ledger.create_or_open(path.c_str(), spec, error)) << error.text;
  return path;
}

class AllocationPath : public ::testing::TestWithParam<const char*> {};

TEST_P(AllocationPath, UnderTheQuotaSucceedsAndIsFullyReturned) {
  ScratchDirectory scratch;
  const Finished done =
      run({worker(), "path", GetParam(), std::to_string(512 * kMiB)}, limited(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.value("result"), "0");
  EXPECT_EQ(done.number("after_free"), kLimit);  // everything charged was given back
  EXPECT_EQ(done.number("after_total"), kLimit);
}

TEST_P(AllocationPath, OverTheQuotaIsACleanOutOfMemory) {
  ScratchDirectory scratch;
  const Finished done =
      run({worker(), "path", GetParam(), std::to_string(1100 * kMiB)}, limited(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.value("result"), "2");  // CUDA_ERROR_OUT_OF_MEMORY
  EXPECT_EQ(done.number("after_free"), kLimit);
}

TEST_P(AllocationPath, HeldMemoryIsChargedToTheGroup) {
  ScratchDirectory scratch;
  const Finished done =
      run({worker(), "path", GetParam(), std::to_string(512 * kMiB), "keep"}, limited(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  ASSERT_EQ(done.value("result"), "0");
  // The group is charged exactly what the driver itself says the process holds, padding
  // and pool reservations included.
  const std::uint64_t charged = kLimit - done.number("after_free");
  EXPECT_GE(charged, 512 * kMiB);
  EXPECT_EQ(charged, done.number("after_driver_used"));
}

INSTANTIATE_TEST_SUITE_P(Hook, AllocationPath,
                         ::testing::Values("alloc", "pitch", "managed", "async", "pool", "vmm",
                                           "array", "array3d", "mipmap"));

TEST(Hook, APoolWhoseReservationCannotBeReadStaysCharged) {
  ScratchDirectory scratch;
  // The driver fails every pool attribute query: what the pool holds cannot be read back.
  const Finished done = run({worker(), "path", "pool", std::to_string(512 * kMiB), "keep"},
                            limited(scratch, {{"TESSERA_SIM_FAIL", "cuMemPoolGetAttribute"}}));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  ASSERT_EQ(done.value("result"), "0");
  EXPECT_GE(kLimit - done.number("after_free"), 512 * kMiB) << "a failed query charged nothing";
}

TEST(Hook, EveryPoolIsSettledAtASyncPointHoweverMany) {
  ScratchDirectory scratch;
  const Finished done =
      run({worker(), "many-pools", "70", std::to_string(8 * kMiB)}, limited(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.number("cached_free"), kLimit - 70 * 8 * kMiB);  // freed, still in the pools
  EXPECT_EQ(done.number("synced_free"), kLimit) << "pools past the 64th stayed charged";
}

TEST(Hook, PitchIsChargedAtTheRealPitch) {
  ScratchDirectory scratch;
  // 1,060,000 rows of 1000 bytes fit in 1 GiB; at the driver's 1024-byte pitch they do not.
  const Finished done =
      run({worker(), "path", "pitch", std::to_string(1000ull * 1060000)}, limited(scratch));
  EXPECT_EQ(done.value("result"), "2") << done.out;
}

TEST(Hook, ArrayPaddingIsCharged) {
  ScratchDirectory scratch;
  // 265,000 rows of 4000 bytes fit in 1 GiB; padded to 4096-byte rows they do not.
  const Finished done =
      run({worker(), "path", "array", std::to_string(4000ull * 265000)}, limited(scratch));
  EXPECT_EQ(done.value("result"), "2") << done.out;
}

TEST(Hook, VmmMemoryStaysChargedWhileMappedAfterRelease) {
  ScratchDirectory scratch;
  const Finished done =
      run({worker(), "path", "vmm", std::to_string(512 * kMiB)}, limited(scratch));
  EXPECT_EQ(done.number("mapped_free"), kLimit - 512 * kMiB);  // released but still mapped
  EXPECT_EQ(done.number("after_free"), kLimit);                // unmapped: gone
}

TEST(Hook, VmmHostLocationsAreNotDeviceMemory) {
  ScratchDirectory scratch;
  const Finished done =
      run({worker(), "path", "vmm-host", std::to_string(1100 * kMiB)}, limited(scratch));
  EXPECT_EQ(done.value("result"), "0");
  EXPECT_EQ(done.number("mapped_free"), kLimit);
}

TEST(Hook, PoolsAreChargedForWhatTheyHoldNotJustWhatIsAllocated) {
  ScratchDirectory scratch;
  const Finished done = run({worker(), "pool-cache", std::to_string(600 * kMiB)}, limited(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.number("cached_free"), kLimit - 600 * kMiB);  // freed, still in the pool
  EXPECT_EQ(done.number("synced_free"), kLimit);               // released at the sync
  EXPECT_EQ(done.number("kept_free"), kLimit - 600 * kMiB);    // a high threshold keeps it
  EXPECT_EQ(done.value("reuse_result"), "0");                  // and it can be reused
  EXPECT_EQ(done.number("trimmed_free"), kLimit);              // trimming gives it back
}

TEST(Hook, ContextsAreCharged) {
  ScratchDirectory scratch;
  const Finished done = run({worker(), "path", "context", "1", "keep"},
                            limited(scratch, {{"TESSERA_SIM_DEVICES", "H100,context=64MiB"}}));
  ASSERT_EQ(done.value("result"), "0") << done.out << done.err;
  // The primary context and the created one, 64 MiB each.
  EXPECT_EQ(done.number("after_free"), kLimit - 128 * kMiB);
}

// On a preset's real context cost (512 MiB on an H100): a group's limit counts its contexts,
// as the device's memory does, and a limit below one context is a clean out-of-memory.
TEST(Hook, ARealContextCountsAgainstTheGroup) {
  ScratchDirectory scratch;
  const Finished done =
      run({worker(), "info"}, limited(scratch, {{"TESSERA_SIM_DEVICES", "H100"}}));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.number("total"), kLimit);
  EXPECT_EQ(done.number("free"), kLimit - 512 * kMiB);
  ScratchDirectory small;
  const Finished refused =
      run({worker(), "init-context"}, limited(small, {{"TESSERA_SIM_DEVICES", "H100"},
                                                      {contract::kMemoryLimitVariable, "256MiB"}}));
  EXPECT_EQ(refused.value("context_result"), "2") << refused.out << refused.err;
}

TEST(Hook, AContextThatDoesNotFitIsRefusedAndTheGroupNeverHoldsIt) {
  ScratchDirectory scratch;
  const Environment environment =
      limited(scratch, {{contract::kLedgerVariable, make_group(scratch, kLimit)},
                        {"TESSERA_SIM_DEVICES", "H100,context=64MiB"}});
  // The first member teaches the group what a context costs, then holds almost everything.
  Running holder({worker(), "hold", std::to_string(kLimit - 64 * kMiB - 32 * kMiB)}, environment);
  ASSERT_EQ(holder.read_line(), "result=0");
  const Finished refused = run({worker(), "init-context"}, environment);
  EXPECT_EQ(refused.value("context_result"), "2");  // CUDA_ERROR_OUT_OF_MEMORY, cleanly
  holder.close_stdin();
  holder.wait();
  // The device never held more than the group's quota, contexts included.
  EXPECT_LE(simulated_device(environment).peak, kLimit);
  const Finished granted = run({worker(), "init-context"}, environment);
  EXPECT_EQ(granted.value("context_result"), "0");
}

class LookupPath : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(LookupPath, EveryWayToTheDriverIsGoverned) {
  ScratchDirectory scratch;
  const auto [mode, aliases] = GetParam();
  const Finished done = run({worker(), "lookup", mode, std::to_string(1100 * kMiB)},
                            limited(scratch, {{"TESSERA_SIM_PROC_ADDRESS_ALIASES", aliases}}));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.value("result"), "2") << mode;
}

INSTANTIATE_TEST_SUITE_P(
    Hook, LookupPath,
    ::testing::Combine(::testing::Values("direct", "dlsym", "procaddress", "procaddress-self",
                                         "procaddress-3020", "procaddress-ptsz"),
                       ::testing::Values("0", "1")));

TEST(Hook, ProcAddressKeepsTheDriversAnswersForMissingAndTooNewSymbols) {
  ScratchDirectory scratch;
  const Finished done = run({worker(), "lookup", "procaddress-ptsz", "1"}, limited(scratch));
  EXPECT_EQ(done.value("missing_status"), "1");  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
  EXPECT_EQ(done.value("missing_pointer"), "null");
  EXPECT_EQ(done.value("early_status"), "2");  // CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
  EXPECT_EQ(done.value("early_pointer"), "null");
}

TEST(Hook, PythonCtypesIsGoverned) {
  ScratchDirectory scratch;
  const char* program =
      "import ctypes\n"
      "c = ctypes.CDLL('libcuda.so.1')\n"
      "ctx = ctypes.c_void_p()\n"
      "assert c.cuInit(0) == 0\n"
      "assert c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0\n"
      "assert c.cuCtxSetCurrent(ctx) == 0\n"
      "p = ctypes.c_ulonglong()\n"
      "print('over=%d' % c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1100 << 20)))\n"
      "print('under=%d' % c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(100 << 20)))\n"
      "f = ctypes.c_size_t(); t = ctypes.c_size_t()\n"
      "c.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))\n"
      "print('free=%d' % f.value)\n";
  const Finished done = run({"/usr/bin/python3", "-c", program}, limited(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.value("over"), "2");
  EXPECT_EQ(done.value("under"), "0");
  EXPECT_EQ(done.number("free"), kLimit - 100 * kMiB);
}

TEST(Hook, ViewsShowTheSliceInCudaAndNvml) {
  ScratchDirectory scratch;
  const Finished done = run({worker(), "nvml", std::to_string(100 * kMiB)}, limited(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  for (const char* prefix : {"nvml", "nvml2"}) {
    const std::string p = prefix;
    EXPECT_EQ(done.number(p + "_total"), kLimit);
    EXPECT_EQ(done.number(p + "_used"), 100 * kMiB);
    EXPECT_EQ(done.number(p + "_free"), kLimit - 100 * kMiB);
  }
  const Finished info = run({worker(), "info"}, limited(scratch));
  EXPECT_EQ(info.number("total"), kLimit);
  EXPECT_EQ(info.number("device_total"), kLimit);
}

TEST(Hook, NvmlListsOnlyTheGroupsOwnProcesses) {
  ScratchDirectory scratch;
  ScratchDirectory other;
  Running neighbour({worker(), "hold", std::to_string(100 * kMiB)},
                    hooked(scratch, {{contract::kLedgerVariable, make_group(other, kLimit)}}));
  ASSERT_EQ(neighbour.read_line(), "result=0");
  const Finished inside =
      run({worker(), "processes", std::to_string(10 * kMiB)},
          hooked(scratch, {{contract::kLedgerVariable, make_group(scratch, kLimit)}}));
  EXPECT_EQ(inside.value("status"), "0");
  EXPECT_EQ(inside.value("processes"), "1");
  EXPECT_EQ(inside.value("pid"), inside.value("self"));
  const Finished outside =
      run({worker(), "processes", std::to_string(10 * kMiB)}, unhooked(scratch));
  EXPECT_EQ(outside.value("processes"), "2");  // the host's view: both processes
  neighbour.close_stdin();
  neighbour.wait();
}

TEST(Hook, WithoutALimitEveryCallPassesThrough) {
  ScratchDirectory scratch;
  const Finished plain = run({worker(), "info"}, unhooked(scratch));
  const Finished hooked_run = run({worker(), "info"}, hooked(scratch));
  EXPECT_EQ(plain.number("total"), hooked_run.number("total"));
  EXPECT_GT(hooked_run.number("total"), 70 * kGiB);
}

TEST(Hook, FreeIsNeverAboveWhatTheDeviceHasFree) {
  ScratchDirectory scratch;
  // A 2 GiB slice of a 1.5 GiB device: the view cannot promise more than exists.
  const Finished done =
      run({worker(), "info"}, hooked(scratch, {{contract::kMemoryLimitVariable, "2GiB"},
                                               {"TESSERA_SIM_DEVICES", "T4,memory=1536MiB"}}));
  EXPECT_EQ(done.number("total"), 1536 * kMiB);
  EXPECT_EQ(done.number("free"), 1536 * kMiB - 256 * kMiB);  // less the T4's context
}

TEST(Hook, ASecondProcessInAGroupSeesTheFirstsUsage) {
  ScratchDirectory scratch;
  const Environment environment =
      limited(scratch, {{contract::kLedgerVariable, make_group(scratch, kLimit)}});
  Running holder({worker(), "hold", std::to_string(400 * kMiB)}, environment);
  ASSERT_EQ(holder.read_line(), "result=0");
  const Finished second = run({worker(), "fill", std::to_string(100 * kMiB)}, environment);
  EXPECT_EQ(second.number("free"), kLimit - 400 * kMiB);
  EXPECT_EQ(second.number("total"), kLimit);
  EXPECT_EQ(second.number("allocated"), 600 * kMiB);
  holder.close_stdin();
  EXPECT_EQ(holder.wait(), 0);
}

TEST(Hook, TwoGroupsOnOneDeviceDoNotAffectEachOther) {
  ScratchDirectory scratch;
  ScratchDirectory other;
  const std::string first = make_group(scratch, kLimit);
  const std::string second = make_group(other, 3 * kGiB);
  Running hog({worker(), "hold", std::to_string(1000 * kMiB)},
              hooked(scratch, {{contract::kLedgerVariable, first}}));
  ASSERT_EQ(hog.read_line(), "result=0");
  // Same simulated device (scratch's state), another group.
  Environment environment = hooked(scratch, {{contract::kLedgerVariable, second}});
  const Finished done = run({worker(), "fill", std::to_string(100 * kMiB)}, environment);
  EXPECT_EQ(done.number("total"), 3 * kGiB);
  EXPECT_EQ(done.number("free"), 3 * kGiB);
  EXPECT_EQ(done.number("allocated"), 30 * 100 * kMiB);
  hog.close_stdin();
  hog.wait();
}

TEST(Hook, AForkedChildIsChargedToTheGroupAndReclaimedWhenItExits) {
  ScratchDirectory scratch;
  const Environment environment =
      limited(scratch, {{contract::kLedgerVariable, make_group(scratch, kLimit)}});
  const Finished done =
      run({worker(), "fork", std::to_string(300 * kMiB), std::to_string(300 * kMiB)}, environment);
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.number("child_free"), kLimit - 300 * kMiB);
  EXPECT_EQ(done.value("child_result"), "0");
  EXPECT_EQ(done.number("child_after_free"), kLimit - 600 * kMiB);
  EXPECT_EQ(done.number("parent_free"), kLimit - 300 * kMiB);
}

TEST(Hook, MemoryOfAnExecedImageIsReclaimed) {
  ScratchDirectory scratch;
  const Environment environment =
      limited(scratch, {{contract::kLedgerVariable, make_group(scratch, kLimit)}});
  const Finished done = run({worker(), "exec", std::to_string(300 * kMiB)}, environment);
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.number("free"), kLimit);
}

TEST(Hook, EightProcessesOfEightThreadsNeverExceedTheQuotaByOneByte) {
  ScratchDirectory scratch;
  // Contexts cost memory too, and are created while the other processes allocate.
  const Environment environment =
      limited(scratch, {{contract::kLedgerVariable, make_group(scratch, kLimit)},
                        {"TESSERA_SIM_DEVICES", "H100,context=16MiB"}});
  std::vector<std::unique_ptr<Running>> processes;
  for (int i = 0; i < 8; ++i) {
    processes.push_back(std::make_unique<Running>(
        std::vector<std::string>{worker(), "stress", "8", "400", std::to_string(64 * kMiB),
                                 std::to_string(i)},
        environment));
  }
  for (auto& process : processes) ASSERT_EQ(process->read_line(), "ready");
  for (auto& process : processes) process->write_line("go");
  long refused = 0;
  for (auto& process : processes) {
    std::string line;
    while (!(line = process->read_line()).empty()) {
      if (line.rfind("refused=", 0) == 0) refused += std::strtol(line.c_str() + 8, nullptr, 10);
    }
    EXPECT_EQ(process->wait(), 0);
  }
  // The simulated device's own record, not the hook's belief: at no instant did the
  // group hold more than its quota.
  const AccountsUsage device = simulated_device(environment);
  EXPECT_LE(device.peak, kLimit);
  EXPECT_GT(device.peak, kLimit * 3 / 4);
  EXPECT_GT(refused, 0);
  ledger::Ledger group;
  ErrorText error;
  ASSERT_TRUE(group.open(scratch.file(contract::kLedgerFileName).c_str(), error));
  EXPECT_EQ(group.usage(0).used, 0u);
  EXPECT_LE(group.usage(0).peak, kLimit);
}

TEST(Hook, KillMinusNineAtRandomInstantsLeaksNothing) {
  ScratchDirectory scratch;
  const Environment environment =
      limited(scratch, {{contract::kLedgerVariable, make_group(scratch, kLimit)}});
  std::mt19937 random(7);
  std::vector<std::unique_ptr<Running>> members;
  for (int i = 0; i < 4; ++i) {
    members.push_back(std::make_unique<Running>(
        std::vector<std::string>{worker(), "churn", std::to_string(i)}, environment));
    ASSERT_EQ(members.back()->read_line(), "ready");
  }
  for (int kill_count = 0; kill_count < 40; ++kill_count) {
    std::this_thread::sleep_for(std::chrono::milliseconds(random() % 30));
    auto& victim = members[random() % members.size()];
    victim->kill_hard();
    EXPECT_EQ(victim->wait(), 128 + SIGKILL);
    victim = std::make_unique<Running>(
        std::vector<std::string>{worker(), "churn", std::to_string(100 + kill_count)}, environment);
    ASSERT_EQ(victim->read_line(), "ready");
  }
  for (auto& member : members) {
    member->kill_hard();
    member->wait();
  }
  // A newcomer gets the whole quota back, and the device agrees nothing is held.
  const Finished after = run({worker(), "fill", std::to_string(64 * kMiB)}, environment);
  EXPECT_EQ(after.number("free"), kLimit);
  EXPECT_EQ(after.number("allocated"), 16 * 64 * kMiB);
  EXPECT_EQ(simulated_device(environment).used, 0u);
}

class MalformedLimit : public ::testing::TestWithParam<std::pair<std::string, const char*>> {};

TEST_P(MalformedLimit, IsAClearErrorAtTheFirstCudaCall) {
  ScratchDirectory scratch;
  const auto [variable, value] = GetParam();
  const Finished done = run({worker(), "init"}, hooked(scratch, {{variable, value}}));
  EXPECT_EQ(done.value("result"), "3");  // CUDA_ERROR_NOT_INITIALIZED: fail closed
  const std::string expected = std::string(variable) + "='" + value + "'";
  EXPECT_NE(done.err.find(expected), std::string::npos) << done.err;
}

INSTANTIATE_TEST_SUITE_P(
    Hook, MalformedLimit,
    ::testing::Values(std::make_pair(std::string(contract::kMemoryLimitVariable), "8XB"),
                      std::make_pair(std::string(contract::kMemoryLimitVariable), "0=8GiB,x"),
                      std::make_pair(std::string(contract::kMemoryLimitVariable), "-1"),
                      std::make_pair(std::string(contract::kMemoryLimitVariable), "0"),
                      std::make_pair(std::string(contract::kHamiMemoryLimitVariable), "lots"),
                      std::make_pair(std::string(contract::kHamiMemoryLimitVariable) + "_2",
                                     "1.5")));

TEST(Hook, ABadLedgerDisablesCudaWithTheReason) {
  ScratchDirectory scratch;
  const std::string path = scratch.file(contract::kLedgerFileName);
  std::ofstream(path) << "not a ledger";
  const Finished done =
      run({worker(), "init"}, hooked(scratch, {{contract::kLedgerVariable, path}}));
  EXPECT_EQ(done.value("result"), "3");
  EXPECT_NE(done.err.find(path), std::string::npos) << done.err;
}

TEST(Hook, TheHookIsSilentUnlessAsked) {
  ScratchDirectory scratch;
  const Finished quiet = run({worker(), "fill", std::to_string(100 * kMiB)}, limited(scratch));
  EXPECT_EQ(quiet.err, "");
  const Finished chatty = run({worker(), "fill", std::to_string(100 * kMiB)},
                              limited(scratch, {{"TESSERA_LOG_LEVEL", "info"}}));
  EXPECT_NE(chatty.err.find("group limit"), std::string::npos) << chatty.err;
}

}  // namespace
}  // namespace tessera::test
