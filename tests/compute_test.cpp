// Compute shares on the simulated GPU, measured by the device's own record of busy time
// (never by the limiter's beliefs), over 2-second windows.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <tuple>

#include "ledger/ledger.h"
#include "simgpu/sim_machine.h"
#include "support.h"

namespace tessera::test {
namespace {

// The device time `pids` got within [from, to) on device 0, as a fraction of the window.
double share_of(const ScratchDirectory& scratch, const std::vector<std::int32_t>& pids,
                std::uint64_t from, std::uint64_t to) {
  setenv("TESSERA_SIM_STATE", scratch.file("simgpu").c_str(), 1);
  unsetenv("TESSERA_SIM_DEVICES");
  ErrorText error;
  sim::Machine machine;
  EXPECT_TRUE(machine.attach(error)) << error.text;
  std::uint64_t busy = 0;
  for (std::int32_t pid : pids) {
    const sim::BusyTime record = machine.busy(0, pid, from, to);
    EXPECT_TRUE(record.complete);
    busy += record.process_ns;
  }
  return static_cast<double>(busy) / static_cast<double>(to - from);
}

constexpr std::uint64_t kSettle = 300'000'000;    // the first 0.3 s: costs are being learned
constexpr std::uint64_t kWindow = 2'000'000'000;  // then a 2-second window

class ComputeShare : public ::testing::TestWithParam<std::tuple<int, const char*, const char*>> {};

TEST_P(ComputeShare, AGroupGetsItsShareWhateverItsKernelsAndLaunchPath) {
  ScratchDirectory scratch;
  const auto [percent, kernel, mode] = GetParam();
  const Finished done = run({worker(), "saturate", mode, kernel, "2.5"},
                            hooked(scratch, {{"TESSERA_CORE_LIMIT", std::to_string(percent)}}));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  const std::uint64_t from = done.number("begin_ns") + kSettle;
  const double share =
      share_of(scratch, {static_cast<std::int32_t>(done.number("pid"))}, from, from + kWindow);
  EXPECT_NEAR(100 * share, percent, 2.0) << kernel << " " << mode;
}

INSTANTIATE_TEST_SUITE_P(Compute, ComputeShare,
                         ::testing::Combine(::testing::Values(10, 30, 50, 70, 90),
                                            ::testing::Values("short@20us", "long@5ms"),
                                            ::testing::Values("plain", "graph", "coop")));

// A group's ledger with a compute share on device 0.
std::string group_with_share(const ScratchDirectory& scratch, const std::string& name,
                             std::uint32_t percent) {
  const std::string path = scratch.file(name + ".ledger");
  ledger::GroupSpec spec;
  spec.name = name.c_str();
  spec.limits.core_percent[0] = percent;
  ledger::Ledger ledger;
  ErrorText error;
  EXPECT_TRUE(ledger.create_or_open(path.c_str(), spec, error)) << error.text;
  return path;
}

struct Member {
  std::int32_t pid;
  std::uint64_t begin;
};

// Runs `count` saturating processes per group at once; returns each group's members.
std::vector<std::vector<Member>> saturate_groups(
    const ScratchDirectory& scratch, const std::vector<std::pair<std::uint32_t, int>>& groups,
    const char* kernel, const char* seconds) {
  std::vector<std::unique_ptr<Running>> processes;
  std::vector<int> group_of;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string ledger = group_with_share(scratch, "g" + std::to_string(g), groups[g].first);
    for (int i = 0; i < groups[g].second; ++i) {
      processes.push_back(std::make_unique<Running>(
          std::vector<std::string>{worker(), "saturate", "plain", kernel, seconds},
          hooked(scratch, {{"TESSERA_LEDGER", ledger}})));
      group_of.push_back(static_cast<int>(g));
    }
  }
  std::vector<std::vector<Member>> members(groups.size());
  for (std::size_t i = 0; i < processes.size(); ++i) {
    Finished done;
    std::string line;
    while (!(line = processes[i]->read_line()).empty()) done.out += line + "\n";
    EXPECT_EQ(processes[i]->wait(), 0);
    members[group_of[i]].push_back(
        {static_cast<std::int32_t>(done.number("pid")), done.number("begin_ns")});
  }
  return members;
}

class GroupOfProcesses : public ::testing::TestWithParam<int> {};

TEST_P(GroupOfProcesses, ShareTheirGroupsShare) {
  ScratchDirectory scratch;
  const auto members = saturate_groups(scratch, {{30, GetParam()}}, "short@20us", "2.6");
  std::uint64_t from = 0;
  std::vector<std::int32_t> pids;
  for (const Member& member : members[0]) {
    from = std::max(from, member.begin + kSettle);
    pids.push_back(member.pid);
  }
  EXPECT_NEAR(100 * share_of(scratch, pids, from, from + kWindow), 30, 2.0)
      << GetParam() << " processes";
}

INSTANTIATE_TEST_SUITE_P(Compute, GroupOfProcesses, ::testing::Values(2, 4));

class CompetingGroups : public ::testing::TestWithParam<std::vector<std::uint32_t>> {};

TEST_P(CompetingGroups, EachGetsItsShareInEveryWindow) {
  ScratchDirectory scratch;
  std::vector<std::pair<std::uint32_t, int>> groups;
  for (std::uint32_t percent : GetParam()) groups.emplace_back(percent, 1);
  const auto members = saturate_groups(scratch, groups, "mid@500us", "2.6");
  std::uint64_t from = 0;
  for (const auto& group : members) from = std::max(from, group[0].begin + kSettle);
  for (std::size_t g = 0; g < members.size(); ++g) {
    const double percent = GetParam()[g];
    EXPECT_NEAR(100 * share_of(scratch, {members[g][0].pid}, from, from + kWindow), percent, 2.0)
        << "group " << g;
    // No oscillation: every 200 ms window gives the group at least half its share.
    for (std::uint64_t start = from; start + 200'000'000 <= from + kWindow; start += 200'000'000) {
      EXPECT_GE(100 * share_of(scratch, {members[g][0].pid}, start, start + 200'000'000),
                percent / 2)
          << "group " << g << " window at +" << (start - from) / 1'000'000 << " ms";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Compute, CompetingGroups,
                         ::testing::Values(std::vector<std::uint32_t>{30, 70},
                                           std::vector<std::uint32_t>{20, 30, 50}));

TEST(Compute, ABurstingGroupUsesIdleTimeAndGivesItBackWithin100Ms) {
  ScratchDirectory scratch;
  const std::string bursting = group_with_share(scratch, "bursting", 30);
  const std::string other = group_with_share(scratch, "other", 70);
  Running first({worker(), "saturate", "plain", "mid@500us", "2.0"},
                hooked(scratch, {{"TESSERA_LEDGER", bursting}, {"TESSERA_CORE_BURST", "1"}}));
  // The scenario: a second group arrives 0.8 s later (a time in the experiment, not a wait
  // for anything to happen).
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  const Finished second = run({worker(), "saturate", "plain", "mid@500us", "0.8"},
                              hooked(scratch, {{"TESSERA_LEDGER", other}}));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  Finished alone;
  std::string line;
  while (!(line = first.read_line()).empty()) alone.out += line + "\n";
  ASSERT_EQ(first.wait(), 0);
  const auto first_pid = static_cast<std::int32_t>(alone.number("pid"));
  const auto second_pid = static_cast<std::int32_t>(second.number("pid"));
  const std::uint64_t arrival = second.number("begin_ns");
  // Alone, it took nearly the whole device.
  EXPECT_GT(share_of(scratch, {first_pid}, alone.number("begin_ns") + kSettle, arrival), 0.95);
  // From 100 ms after the newcomer arrived, each has its share.
  const std::uint64_t from = arrival + 100'000'000, to = arrival + 700'000'000;
  EXPECT_NEAR(100 * share_of(scratch, {second_pid}, from, to), 70, 2.0);
  EXPECT_NEAR(100 * share_of(scratch, {first_pid}, from, to), 30, 2.0);
}

TEST(Compute, WithoutAShareAGroupSaturatesTheDevice) {
  ScratchDirectory scratch;
  const Finished done = run({worker(), "saturate", "plain", "k@200us", "1.0"}, hooked(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.err;
  const std::uint64_t from = done.number("begin_ns") + 100'000'000;
  EXPECT_GT(
      share_of(scratch, {static_cast<std::int32_t>(done.number("pid"))}, from, from + 800'000'000),
      0.95);
}

TEST(Compute, MalformedSharesAreAClearErrorAtTheFirstCudaCall) {
  ScratchDirectory scratch;
  for (const auto& [variable, value] :
       {std::pair{"TESSERA_CORE_LIMIT", "0"}, std::pair{"TESSERA_CORE_LIMIT", "130"},
        std::pair{"CUDA_DEVICE_SM_LIMIT", "half"}, std::pair{"TESSERA_CORE_LIMIT", "0=30,x"},
        std::pair{"TESSERA_CORE_BURST", "yes"}}) {
    const Finished done = run({worker(), "init"}, hooked(scratch, {{variable, value}}));
    EXPECT_EQ(done.value("result"), "3") << variable << "=" << value;
    EXPECT_NE(done.err.find(std::string(variable) + "='" + value + "'"), std::string::npos)
        << done.err;
  }
}

}  // namespace
}  // namespace tessera::test
