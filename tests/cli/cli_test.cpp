// The tessera command as a user meets it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "contract/variables.h"
#include "ledger/ledger.h"
#include "support.h"

namespace tessera::test {
namespace {

Environment cli_environment(const ScratchDirectory& scratch) {
  return {{"TESSERA_RUNTIME_DIR", scratch.path()},
          {"TESSERA_SIM_STATE", scratch.file("simgpu")},
          {"TESSERA_SIM_DEVICES", test::kTestDevices}};
}

TEST(Cli, DevicesSaysTheGpusAreSimulated) {
  ScratchDirectory scratch;
  const Finished done = run({tessera(), "devices"}, cli_environment(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.out.find("2 GPU(s), simulated"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("NVIDIA H100 80GB HBM3"), std::string::npos);
  EXPECT_NE(done.out.find("NVIDIA A100-SXM4-40GB"), std::string::npos);
  const Finished json = run({tessera(), "devices", "--json"}, cli_environment(scratch));
  const auto list = nlohmann::json::parse(json.out);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1]["memory_total"].get<std::uint64_t>(), 40536 * kMiB);
  EXPECT_TRUE(list[0]["simulated"].get<bool>());
}

TEST(Cli, RunLimitsTheCommandAndPassesItsExitCode) {
  ScratchDirectory scratch;
  const Finished done = run(
      {tessera(), "run", "--memory", "2GiB", "--", worker(), "fill", std::to_string(256 * kMiB)},
      cli_environment(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_EQ(done.number("total"), 2 * kGiB);
  EXPECT_EQ(done.number("allocated"), 8 * 256 * kMiB);
  EXPECT_EQ(done.value("error"), "2");
  EXPECT_NE(done.err.find("using the simulated GPU"), std::string::npos);
  // The group's ledger went with the command.
  for (const auto& entry : std::filesystem::directory_iterator(scratch.path())) {
    EXPECT_NE(entry.path().extension(), ".ledger") << entry.path();
  }
  const Finished failing =
      run({tessera(), "run", "--memory", "1GiB", "--", "/bin/sh", "-c", "exit 7"},
          cli_environment(scratch));
  EXPECT_EQ(failing.exit_code, 7);
}

TEST(Cli, DeviceGivesTheGroupOneGpu) {
  ScratchDirectory scratch;
  const Finished done =
      run({tessera(), "run", "--device", "1", "--memory", "3GiB", "--", worker(), "info"},
          cli_environment(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_EQ(done.number("total"), 3 * kGiB);
  EXPECT_EQ(done.number("device_total"), 3 * kGiB);
}

TEST(Cli, NamedGroupsShareOneLimitAndTopShowsThem) {
  ScratchDirectory scratch;
  const Environment environment = cli_environment(scratch);
  Running holder({tessera(), "run", "--memory", "1GiB", "--group", "shared", "--keep", "--",
                  worker(), "hold", std::to_string(600 * kMiB)},
                 environment);
  ASSERT_EQ(holder.read_line(), "result=0");
  const Finished second = run({tessera(), "run", "--memory", "1GiB", "--group", "shared", "--keep",
                               "--", worker(), "fill", std::to_string(100 * kMiB)},
                              environment);
  EXPECT_EQ(second.number("allocated"), 4 * 100 * kMiB);
  const Finished top = run({tessera(), "top", "--json"}, environment);
  ASSERT_EQ(top.exit_code, 0) << top.err;
  const auto rows = nlohmann::json::parse(top.out);
  ASSERT_EQ(rows.size(), 1u) << top.out;
  EXPECT_EQ(rows[0]["group"], "shared");
  EXPECT_EQ(rows[0]["limit"].get<std::uint64_t>(), kGiB);
  EXPECT_EQ(rows[0]["used"].get<std::uint64_t>(), 600 * kMiB);
  EXPECT_EQ(rows[0]["peak"].get<std::uint64_t>(), 1000 * kMiB);  // 600 + 4 x 100
  EXPECT_EQ(rows[0]["refused"].get<std::uint64_t>(), 1u);
  EXPECT_EQ(rows[0]["members"].get<int>(), 1);
  holder.close_stdin();
  EXPECT_EQ(holder.wait(), 0);
  const Finished table = run({tessera(), "top", "--once"}, environment);
  EXPECT_NE(table.out.find("shared"), std::string::npos) << table.out;
}

TEST(Cli, TopShowsTheTimeALowPriorityGroupGaveWayAndTheToleranceIsPassedOn) {
  ScratchDirectory scratch;
  const Environment environment = cli_environment(scratch);
  // A high-priority group keeping the device busy with 1 ms kernels, back to back.
  Running web({tessera(), "run", "--priority", "high", "--priority-tolerance", "20", "--group",
               "web", "--keep", "--", worker(), "saturate", "plain", "hi@1ms", "1.5"},
              environment);
  ASSERT_EQ(web.read_line(), "started");
  const Finished batch = run({tessera(), "run", "--priority", "low", "--group", "batch", "--keep",
                              "--", worker(), "saturate", "plain", "lo@20us", "0.5"},
                             environment);
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  EXPECT_EQ(web.finish().exit_code, 0);
  const auto rows = nlohmann::json::parse(run({tessera(), "top", "--json"}, environment).out);
  ASSERT_EQ(rows.size(), 2u) << rows.dump();
  const auto& low = rows[0]["group"] == "batch" ? rows[0] : rows[1];
  EXPECT_EQ(low["priority"], "low");
  EXPECT_EQ(low["throttled_ms"].get<int>(), 0);  // no share: it never waited for one
  // It gave way while the high-priority group worked (all but the host's gaps of 0.5 s).
  EXPECT_GT(low["held_for_priority_ms"].get<int>(), 100) << rows.dump();

  const Finished passed = run(
      {tessera(), "run", "--priority", "high", "--priority-tolerance", "20", "--", "/usr/bin/env"},
      environment);
  EXPECT_NE(passed.out.find(std::string(contract::kPriorityToleranceVariable) + "=20\n"),
            std::string::npos)
      << passed.out;
  for (const auto& [arguments, message] :
       {std::pair{std::vector<std::string>{"--priority", "high", "--priority-tolerance", "0"},
                  "--priority-tolerance 0 must be from 1 to 100"},
        std::pair{std::vector<std::string>{"--priority", "low", "--priority-tolerance", "5"},
                  "--priority-tolerance needs --priority high"}}) {
    std::vector<std::string> argv = {tessera(), "run"};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    argv.insert(argv.end(), {"--", "true"});
    const Finished refused = run(argv, environment);
    EXPECT_NE(refused.exit_code, 0);
    EXPECT_NE(refused.err.find(message), std::string::npos) << refused.err;
  }
}

TEST(Cli, CoresGiveTheGroupAComputeShareThatTopShows) {
  ScratchDirectory scratch;
  const Environment environment = cli_environment(scratch);
  const Finished done =
      run({tessera(), "run", "--memory", "1GiB", "--cores", "25", "--group", "slow", "--keep", "--",
           worker(), "saturate", "plain", "k@100us", "0.6"},
          environment);
  ASSERT_EQ(done.exit_code, 0) << done.err;
  const auto rows = nlohmann::json::parse(run({tessera(), "top", "--json"}, environment).out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["cores"].get<int>(), 25);
  EXPECT_EQ(rows[0]["priority"], "-");
  EXPECT_GT(rows[0]["throttled_ms"].get<int>(), 200);  // it wanted the whole device
  // 0.6 s at 25 % is 150 ms of device time: never more (the cap), and no less than the host
  // let the workload run (a launching thread kept off the CPU launches nothing); nothing ran
  // during top's own interval.
  const double device_ms = rows[0]["device_time_ns"].get<double>() / 1e6;
  const double allowed = done.host().allowed(done.number("begin_ns"), done.number("end_ns"));
  EXPECT_LE(device_ms, 150 + 15);
  EXPECT_GE(device_ms, 150 * allowed - 15)
      << "the host let the workload run " << 100 * allowed << " % of its time";
  EXPECT_EQ(rows[0]["achieved_percent"].get<double>(), 0.0);
  const Finished bad =
      run({tessera(), "run", "--memory", "1GiB", "--cores", "101", "--", "true"}, environment);
  EXPECT_NE(bad.err.find("--cores 101 must be a percentage from 1 to 100"), std::string::npos)
      << bad.err;
  const Finished lone_burst =
      run({tessera(), "run", "--memory", "1GiB", "--burst", "--", "true"}, environment);
  EXPECT_NE(lone_burst.exit_code, 0);
  EXPECT_NE(lone_burst.err.find("--burst needs --cores"), std::string::npos) << lone_burst.err;
  const Finished urgent = run(
      {tessera(), "run", "--memory", "1GiB", "--priority", "urgent", "--", "true"}, environment);
  EXPECT_NE(urgent.exit_code, 0);
  EXPECT_NE(urgent.err.find("--priority 'urgent' must be high or low"), std::string::npos)
      << urgent.err;
  // The group's processes are told their priority, and top shows the group's.
  const Finished told = run({tessera(), "run", "--memory", "1GiB", "--priority", "low", "--group",
                             "batch", "--keep", "--", "printenv", contract::kPriorityVariable},
                            environment);
  EXPECT_EQ(told.out, "low\n") << told.err;
  const Finished table = run({tessera(), "top", "--once", "--interval", "0.1"}, environment);
  EXPECT_NE(table.out.find("PRIORITY"), std::string::npos) << table.out;
  const auto batch_rows = nlohmann::json::parse(
      run({tessera(), "top", "--json", "--interval", "0.1"}, environment).out);
  bool found = false;
  for (const auto& row : batch_rows) {
    if (row["group"] == "batch") {
      found = true;
      EXPECT_EQ(row["priority"], "low");
    }
  }
  EXPECT_TRUE(found) << batch_rows.dump();
}

TEST(Cli, TopShowsTheShareAGroupAchievesWhileItRuns) {
  ScratchDirectory scratch;
  const Environment environment = cli_environment(scratch);
  Running busy({tessera(), "run", "--memory", "1GiB", "--cores", "40", "--group", "busy", "--",
                worker(), "saturate", "plain", "k@100us", "6"},
               environment);
  // Until the group has launched, top's interval may begin before its first kernel.
  nlohmann::json rows;
  for (int attempt = 0; attempt < 4 && (rows.empty() || rows[0]["device_time_ns"] == 0);
       ++attempt) {
    rows = nlohmann::json::parse(
        run({tessera(), "top", "--json", "--interval", "0.5"}, environment).out);
  }
  const std::uint64_t from = monotonic_ns();
  rows =
      nlohmann::json::parse(run({tessera(), "top", "--json", "--interval", "1"}, environment).out);
  const std::uint64_t to = monotonic_ns();
  const Finished done = busy.finish();
  EXPECT_EQ(done.exit_code, 0);
  ASSERT_EQ(rows.size(), 1u) << rows.dump();
  // The cap holds whatever the host does; the share reached is judged against the time the
  // host let the group run while top measured (tests/support/host_record.h).
  const double achieved = rows[0]["achieved_percent"].get<double>();
  const double allowed = done.host().allowed(from, to);
  EXPECT_LE(achieved, 44);
  EXPECT_GE(achieved, 40 * allowed - 4) << "the host let the group run " << 100 * allowed << " %";
}

TEST(Cli, TopReportsAnUnreadableLedgerAndCarriesOn) {
  ScratchDirectory scratch;
  std::ofstream(scratch.file("broken.ledger")) << "garbage";
  const Finished top = run({tessera(), "top", "--once"}, cli_environment(scratch));
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.out.find("broken"), std::string::npos);
  EXPECT_NE(top.out.find("unreadable"), std::string::npos) << top.out;
}

TEST(Cli, TopJsonShowsALedgerWhoseNameIsNotUtf8) {
  ScratchDirectory scratch;
  std::ofstream(scratch.file("caf\xe9.ledger")) << "garbage";  // Latin-1, not UTF-8
  const Finished top =
      run({tessera(), "top", "--json", "--interval", "0.1"}, cli_environment(scratch));
  ASSERT_EQ(top.exit_code, 0) << top.err;
  const auto rows = nlohmann::json::parse(top.out);
  ASSERT_EQ(rows.size(), 1u) << top.out;
  EXPECT_EQ(rows[0]["group"], "caf\xef\xbf\xbd");  // U+FFFD in place of the byte
  EXPECT_TRUE(rows[0].contains("error"));
}

TEST(Cli, ARunEndingFirstLeavesTheLedgerToARunWhoseWorkloadHasNotJoinedYet) {
  ScratchDirectory scratch;
  const Environment environment = cli_environment(scratch);
  // The second run's workload has not made its first CUDA call when the first run ends.
  const std::string ledger = std::string("\"$") + contract::kLedgerVariable + "\"";
  Running waiting({tessera(), "run", "--memory", "1GiB", "--group", "g", "--", "/bin/sh", "-c",
                   "echo ready; read go; test -e " + ledger +
                       " && echo present || echo absent; exec \"$0\" info",
                   worker()},
                  environment);
  ASSERT_EQ(waiting.read_line(), "ready");
  const Finished first =
      run({tessera(), "run", "--memory", "1GiB", "--group", "g", "--", "/bin/true"}, environment);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  waiting.write_line("go");
  EXPECT_EQ(waiting.read_line(), "present") << "the first run removed the group's ledger";
  const Finished rest = waiting.finish();
  EXPECT_EQ(rest.exit_code, 0);
  EXPECT_EQ(rest.number("total"), kGiB) << rest.out;
  // The last run out removes it.
  EXPECT_FALSE(std::filesystem::exists(scratch.file("g.ledger")));
}

TEST(Cli, ALedgerZeroedUnderItsMembersNeverLiftsTheirLimit) {
  ScratchDirectory scratch;
  const Environment environment = cli_environment(scratch);
  Running holder({tessera(), "run", "--memory", "100MiB", "--group", "z", "--keep", "--", worker(),
                  "hold", std::to_string(90 * kMiB)},
                 environment);
  ASSERT_EQ(holder.read_line(), "result=0");
  Running second({tessera(), "run", "--memory", "100MiB", "--group", "z", "--keep", "--", worker(),
                  "two-step", std::to_string(kMiB), std::to_string(50 * kMiB)},
                 environment);
  ASSERT_EQ(second.read_line(), "result=0");
  {  // zeroed in place, as `dd if=/dev/zero of=z.ledger conv=notrunc` does
    const std::string path = scratch.file("z.ledger");
    const auto size = std::filesystem::file_size(path);
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    const std::string zeroes(size, '\0');
    file.write(zeroes.data(), static_cast<std::streamsize>(zeroes.size()));
  }
  second.write_line("go");
  const std::string answer = second.read_line();
  EXPECT_NE(answer, "second_result=0") << "141 MiB held under a 100 MiB limit";
  EXPECT_EQ(answer.rfind("second_result=", 0), 0u) << answer;
  holder.close_stdin();
  second.close_stdin();
  EXPECT_EQ(holder.wait(), 0);
  EXPECT_EQ(second.wait(), 0);
}

TEST(Cli, ALedgerDamagedUnderARunIsReportedAndTheExitStatusKept) {
  const std::string ledger = std::string("\"$") + contract::kLedgerVariable + "\"";
  const struct {
    const char* name;
    std::string damage;
  } damages[] = {
      {"truncated", "truncate -s 0 " + ledger},
      {"bytes written over it", "tr '\\000' '\\132' < /dev/zero | head -c \"$(stat -c %s " +
                                    ledger + ")\" | dd of=" + ledger + " conv=notrunc status=none"},
  };
  for (const auto& damage : damages) {
    ScratchDirectory scratch;
    const Finished done = run({tessera(), "run", "--memory", "1GiB", "--", "/bin/sh", "-c",
                               std::string(damage.damage) + "; exit 3"},
                              cli_environment(scratch));
    EXPECT_EQ(done.exit_code, 3) << damage.name << ": " << done.err;
    EXPECT_NE(done.err.find("is damaged"), std::string::npos) << damage.name << ": " << done.err;
  }
}

#ifdef __GLIBC__
TEST(Cli, ALedgerLockWrittenOverUnderARunDoesNotAbortIt) {
  ScratchDirectory scratch;
  Running waiting({tessera(), "run", "--memory", "1GiB", "--group", "w", "--", "/bin/sh", "-c",
                   "echo ready; read go; exit 3"},
                  cli_environment(scratch));
  ASSERT_EQ(waiting.read_line(), "ready");
  // What random bytes made of the lock once: a robust priority-inheriting mutex owned by a
  // thread that does not exist, on which glibc aborts (`e != ESRCH || !robust`). glibc's
  // kind bits: 16 robust, 32 priority-inheriting, 128 process-shared.
  pthread_mutex_t forged{};
  forged.__data.__kind = 16 | 32 | 128;
  forged.__data.__lock = 0x3ffffff0;
  {
    std::fstream file(scratch.file("w.ledger"), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(offsetof(ledger::LedgerFile, accounts) + offsetof(SharedAccounts, lock));
    file.write(reinterpret_cast<const char*>(&forged), sizeof forged);
  }
  waiting.write_line("go");
  EXPECT_EQ(waiting.wait(), 3) << "134 is SIGABRT";
}
#endif

TEST(Cli, BadInputIsRefusedWithTheReasonAndUsageStatus) {
  ScratchDirectory scratch;
  struct Case {
    std::vector<std::string> arguments;
    const char* expected;
    int exit_code;  // 2: refused arguments (usage); 127: the command could not be started
  } cases[] = {
      {{"run", "--memory", "8XB", "--", "true"}, "--memory '8XB' is not a size", 2},
      {{"run", "--memory", "1GiB", "--group", "a b", "--", "true"}, "--group 'a b' must be", 2},
      {{"run", "--memory", "1GiB", "--device", "99", "--", "true"},
       "--device 99 is out of range",
       2},
      // The machine has two GPUs: 2 names none of them.
      {{"run", "--memory", "1GiB", "--device", "2", "--", "true"},
       "--device 2: this machine has 2 GPUs (0 to 1)",
       2},
      {{"run", "--memory", "1GiB", "--cores", "0", "--", "true"},
       "--cores 0 must be a percentage",
       2},
      {{"run", "--memory", "1GiB", "--burst", "--", "true"}, "--burst needs --cores", 2},
      {{"run", "--memory", "1GiB"}, "command is required", 2},
      {{"run", "--memory"}, "--memory", 2},
      {{"run", "--memory", "1GiB", "--frob", "--", "true"}, "--frob", 2},
      {{"sim", "--nodes", "n.csv"}, "--pods is required", 2},
      {{"scheduler", "--listen", "127.0.0.1:abc"}, "--listen '127.0.0.1:abc'", 2},
      {{"frobnicate"}, "frobnicate", 2},
      {{"run", "--memory", "1GiB", "--", "/no/such/program"}, "cannot run '/no/such/program'", 127},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv{tessera()};
    argv.insert(argv.end(), c.arguments.begin(), c.arguments.end());
    const Finished done = run(argv, cli_environment(scratch));
    EXPECT_EQ(done.exit_code, c.exit_code) << c.expected << ": " << done.err;
    EXPECT_NE(done.err.find(c.expected), std::string::npos) << c.expected << " vs: " << done.err;
  }
}

TEST(Cli, CoresAloneGiveAComputeShareWithUnlimitedMemory) {
  ScratchDirectory scratch;
  const Finished done =
      run({tessera(), "run", "--cores", "30", "--", worker(), "info"}, cli_environment(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_EQ(done.number("total"), 81559 * kMiB);  // the whole H100: no memory limit
  const Finished told = run({tessera(), "run", "--cores", "30", "--", "printenv",
                             contract::kCoreLimitVariable, contract::kMemoryLimitVariable},
                            cli_environment(scratch));
  EXPECT_EQ(told.out, "30\n") << told.err;  // and no memory limit variable at all
  EXPECT_EQ(told.exit_code, 1);             // printenv: one of the two is unset
}

TEST(Cli, AGroupCannotBeJoinedWithADifferentLimit) {
  ScratchDirectory scratch;
  const Environment environment = cli_environment(scratch);
  ASSERT_EQ(run({tessera(), "run", "--memory", "1GiB", "--group", "g", "--keep", "--", "true"},
                environment)
                .exit_code,
            0);
  const Finished done =
      run({tessera(), "run", "--memory", "2GiB", "--group", "g", "--", "true"}, environment);
  EXPECT_EQ(done.exit_code, 1);
  EXPECT_NE(done.err.find("group exists with a memory limit of 1073741824 bytes"),
            std::string::npos)
      << done.err;
}

TEST(Cli, HelpIsEverywhere) {
  for (const char* command : {"run", "devices", "top"}) {
    const Finished done = run({tessera(), command, "--help"});
    EXPECT_EQ(done.exit_code, 0) << command;
    EXPECT_NE(done.out.find("--"), std::string::npos) << command;
  }
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

// `tessera sim` on traces written here, under a timeout so that a hang fails the test.
Finished sim_on(const ScratchDirectory& scratch, const std::string& nodes, const std::string& pods,
                std::vector<std::string> extra = {}) {
  std::ofstream(scratch.file("nodes.csv")) << nodes;
  std::ofstream(scratch.file("pods.csv")) << pods;
  std::vector<std::string> argv{"/usr/bin/timeout",
                                "-s",
                                "KILL",
                                "60",
                                tessera(),
                                "sim",
                                "--nodes",
                                scratch.file("nodes.csv"),
                                "--pods",
                                scratch.file("pods.csv"),
                                "--policies",
                                "best-fit,fgd"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run(argv);
}

const char* const kTwoNodes =
    "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,262144,2,T4\nn2,64000,262144,8,V100M32\n";

TEST(Sim, AnswersOrRefusesEveryTraceWithoutHangingOrAborting) {
  ScratchDirectory scratch;
  struct Case {
    std::string nodes, pods;
    std::vector<std::string> extra;
    int exit_code;
    const char* expected;
  } cases[] = {
      // Pods that ask for no GPU never reach a GPU load: refused, not looped on forever.
      {kTwoNodes,
       "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,0,0\n",
       {},
       1,
       "no pod in the trace asks for a GPU"},
      {"sn,cpu_milli,memory_mib,gpu,model\nc1,32000,262144,0,\n",
       "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\n",
       {},
       1,
       "no node in the list has a GPU"},
      // A trace without times cannot be replayed: said, without an uncaught exception.
      {kTwoNodes,
       "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\n",
       {"--replay"},
       1,
       "has no creation time"},
      {kTwoNodes,
       "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\n",
       {"--seeds", "42abc"},
       2,
       "--seeds '42abc'"},
      {kTwoNodes,
       "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\n",
       {"--seeds", "51-42"},
       2,
       "--seeds '51-42'"},
      {kTwoNodes,
       "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\n",
       {"--seeds", "99999999999999999999999"},
       2,
       "--seeds"},
  };
  for (const Case& c : cases) {
    const Finished done = sim_on(scratch, c.nodes, c.pods, c.extra);
    EXPECT_EQ(done.exit_code, c.exit_code) << c.expected << "\n" << done.err;
    EXPECT_NE(done.err.find(c.expected), std::string::npos) << c.expected << " vs: " << done.err;
  }
}

TEST(Sim, MigOptionsAreCheckedByName) {
  ScratchDirectory scratch;
  const char* const pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,200\n";
  const struct {
    std::vector<std::string> extra;
    const char* expected;
  } cases[] = {
      {{"--mig-nodes", "1.5"}, "--mig-nodes 1.5 must be from 0 to 1"},
      {{"--mig-pods", "-0.1"}, "--mig-pods -0.1 must be from 0 to 1"},
      {{"--mig-nodes", "1", "--mig-model", "T4"}, "--mig-model 'T4' is not a MIG-capable model"},
      {{"--mig-nodes", "1", "--mig-layout", "3g.20gb=x"}, "'3g.20gb=x' is not profile=count"},
      {{"--mig-nodes", "1", "--mig-layout", "5g.20gb=1"}, "'5g.20gb=1' is not profile=count"},
      {{"--mig-nodes", "1", "--mig-gpus", "9"}, "--mig-gpus 9 must be from 1 to --mig-node-gpus"},
      {{"--mig-nodes", "1", "--recut-seconds", "-1"}, "--recut-seconds -1 must be from 0"},
      {{"--mig-nodes", "1", "--preemption"}, "the --mig options apply to sampled arrivals"},
  };
  for (const auto& c : cases) {
    const Finished done = sim_on(scratch, kTwoNodes, pods, c.extra);
    EXPECT_EQ(done.exit_code, 2) << c.expected << "\n" << done.err;
    EXPECT_NE(done.err.find(c.expected), std::string::npos) << c.expected << " vs: " << done.err;
  }
  // A layout that names real profiles but does not fit the GPU: refused with the reason.
  const Finished too_big =
      sim_on(scratch, kTwoNodes, pods, {"--mig-nodes", "1", "--mig-layout", "4g.20gb=2"});
  EXPECT_EQ(too_big.exit_code, 1) << too_big.err;
  EXPECT_NE(too_big.err.find("MIG layout '4g.20gb=2' does not fit a A100-40GB"), std::string::npos)
      << too_big.err;
}

TEST(Sim, DynamicMigReportsItsChanges) {
  ScratchDirectory scratch;
  std::string pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n";
  for (int i = 0; i < 20; ++i) pods += "s" + std::to_string(i) + ",1000,1024,1,250\n";
  pods += "w,1000,1024,1,1000\n";
  const Finished done = sim_on(scratch, kTwoNodes, pods,
                               {"--seeds", "1-3", "--mig-nodes", "1", "--mig-pods", "0.5",
                                "--mig-layout", "whole", "--dynamic-mig"});
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.out.find("Dynamic MIG, mean per run"), std::string::npos) << done.out;
  EXPECT_EQ(done.out.find("offline-packer"), std::string::npos) << "references know no MIG";
}

TEST(Sim, ANodeListWithMoreGpuModelsThanTheEngineHoldsIsRefused) {
  ScratchDirectory scratch;
  std::string nodes = "sn,cpu_milli,memory_mib,gpu,model\n";
  for (int i = 0; i < 70; ++i) {
    nodes += "n" + std::to_string(i) + ",32000,262144,1,M" + std::to_string(i) + "\n";
  }
  const Finished done =
      sim_on(scratch, nodes, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\n");
  EXPECT_EQ(done.exit_code, 1) << done.err;
  EXPECT_NE(done.err.find("70 GPU models; the engine holds at most 63"), std::string::npos)
      << done.err;
}

TEST(Sim, AFewGpuPodsAmongManyCpuPodsStillFinish) {
  ScratchDirectory scratch;
  std::string pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n";
  for (int i = 0; i < 200; ++i) pods += "c" + std::to_string(i) + ",100,128,0,0\n";
  pods += "g,1000,1024,1,1000\n";
  const Finished done = sim_on(scratch, kTwoNodes, pods, {"--seeds", "1-3"});
  EXPECT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.out.find("best-fit"), std::string::npos) << done.out;
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

// Where the API server is comes from the flags or the pod: neither is a usage error, and a
// token file that is no token is refused with its path before anything is served.
TEST(Cli, SchedulerConnectionSettingsAreCheckedWithReasons) {
  ScratchDirectory scratch;
  // Empty service variables (as some launchers leave them) are no cluster.
  const Environment outside{{"KUBERNETES_SERVICE_HOST", ""}, {"KUBERNETES_SERVICE_PORT", ""}};
  const Finished no_server = run({tessera(), "scheduler", "--listen", "127.0.0.1:0"}, outside);
  EXPECT_EQ(no_server.exit_code, 2) << no_server.err;
  EXPECT_NE(no_server.err.find("--api-server is required outside a cluster"), std::string::npos)
      << no_server.err;
  const std::string token = scratch.file("token");
  std::ofstream(token) << "abc\nX-Injected: 1\n";
  const Finished bad_token = run({tessera(), "scheduler", "--listen", "127.0.0.1:0", "--api-server",
                                  "http://127.0.0.1:1", "--token-file", token},
                                 outside);
  EXPECT_NE(bad_token.exit_code, 0);
  EXPECT_NE(bad_token.err.find(token), std::string::npos) << bad_token.err;
  EXPECT_NE(bad_token.err.find("more than one line"), std::string::npos) << bad_token.err;
}

}  // namespace
}  // namespace tessera::test
