// MPS on the simulated GPU: the simulated nvidia-cuda-mps-control (daemon and command client)
// and the simulated driver as its client, held to the daemon's limits.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <thread>

#include "simgpu/sim_machine.h"
#include "support.h"

namespace tessera::test {
namespace {

std::string mps_control() {
  return build_path("sim/nvidia-cuda-mps-control");
}

// A simulated H100 and an MPS pipe and log directory of the scratch directory's own.
struct MpsMachine {
  ScratchDirectory scratch;
  std::string pipe = scratch.file("mps/pipe");
  std::string log = scratch.file("mps/log");
  Environment environment = unhooked(scratch, {{"CUDA_MPS_PIPE_DIRECTORY", pipe},
                                               {"CUDA_MPS_LOG_DIRECTORY", log},
                                               {"TESSERA_SIM_DEVICES", "H100"}});

  // The daemon in the foreground, until it is told to quit or killed.
  std::unique_ptr<Running> start_daemon() const {
    auto daemon =
        std::make_unique<Running>(std::vector<std::string>{mps_control(), "-f"}, environment);
    // It answers once its socket is bound; until then a command finds no daemon.
    for (int tries = 0; tries < 500 && !answers(); ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling its start
    }
    return daemon;
  }
  bool answers() const {
    struct stat info {};
    return stat((pipe + "/control").c_str(), &info) == 0;
  }
  // Commands, one a line, through the command client.
  Finished control(const std::string& commands) const {
    const std::string script = scratch.file("commands");
    std::FILE* file = std::fopen(script.c_str(), "w");
    std::fputs(commands.c_str(), file);
    std::fclose(file);
    return run({"/bin/sh", "-c", "exec \"$0\" < \"$1\"", mps_control(), script}, environment);
  }
  Finished worker_run(const std::vector<std::string>& arguments,
                      const Environment& extra = {}) const {
    Environment settings = environment;
    for (const auto& [key, value] : extra) settings[key] = value;
    std::vector<std::string> argv{worker()};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    return run(argv, settings);
  }
};

TEST(MpsControl, TheDaemonKeepsItsDefaultsRefusesBadOnesAndRecordsEveryCommand) {
  MpsMachine machine;
  // No daemon yet: the command client says so, as NVIDIA's does.
  Finished none = machine.control("get_server_list\n");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("Cannot find MPS control daemon process"), std::string::npos);
  // -d returns once the daemon answers, and a second one is refused.
  ASSERT_EQ(run({mps_control(), "-d"}, machine.environment).exit_code, 0);
  ASSERT_TRUE(machine.answers());
  Finished second = run({mps_control(), "-d"}, machine.environment);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.err.find("already running"), std::string::npos) << second.err;
  Finished answers = machine.control(
      "set_default_active_thread_percentage 25\n"
      "set_default_device_pinned_mem_limit 0 2G\n"
      "get_default_active_thread_percentage\n"
      "get_default_device_pinned_mem_limit 0\n"
      "set_default_active_thread_percentage 0\n"
      "set_default_active_thread_percentage 101\n"
      "set_default_device_pinned_mem_limit 0 2X\n"
      "set_default_device_pinned_mem_limit 99 2G\n"
      "launch_missiles\n");
  ASSERT_EQ(answers.exit_code, 0) << answers.err;
  EXPECT_EQ(
      answers.out,
      "25.0\n25.0\n2048M\n"
      "Invalid active thread percentage: 0\nInvalid active thread percentage: 101\n"
      "Invalid memory limit: 2X\nInvalid device: 99\nUnrecognized command: launch_missiles\n");
  // The refused values changed nothing; a client attaches and is listed while it lives.
  EXPECT_EQ(machine.control("get_default_active_thread_percentage\n").out, "25.0\n");
  Running client({worker(), "hold", "1048576"}, machine.environment);
  ASSERT_EQ(client.read_line(), "result=0");
  EXPECT_NE(machine.control("get_server_list\n").out, "");
  client.close_stdin();
  ASSERT_EQ(client.wait(), 0);
  // quit: the socket goes, and CUDA runs without MPS again.
  ASSERT_EQ(machine.control("quit\n").exit_code, 0);
  for (int tries = 0; tries < 500 && machine.answers(); ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling its exit
  }
  EXPECT_FALSE(machine.answers());
  EXPECT_EQ(machine.worker_run({"init"}).value("result"), "0");
  const std::string record = read_text_file(machine.log + "/control.log");
  EXPECT_NE(record.find("Starting control daemon using socket " + machine.pipe + "/control"),
            std::string::npos)
      << record;
  for (const char* command : {"Accepting command: set_default_active_thread_percentage 25",
                              "Accepting command: set_default_device_pinned_mem_limit 0 2G",
                              "Accepting command: quit", "connected", "disconnected"}) {
    EXPECT_NE(record.find(command), std::string::npos) << command << "\n" << record;
  }
}

// A client is held to the daemon's pinned-memory limit (lowered, never raised, by its own
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); when its daemon dies it fails, and a new process finding
// the dead daemon's socket cannot connect.
TEST(MpsClient, IsHeldToThePinnedLimitAndFailsWhenItsDaemonDies) {
  MpsMachine machine;
  const std::unique_ptr<Running> daemon = machine.start_daemon();
  ASSERT_TRUE(machine.answers());
  ASSERT_EQ(machine.control("set_default_device_pinned_mem_limit 0 4G\n").exit_code, 0);
  constexpr std::uint64_t kChunk = 128ull << 20, kGiB = 1ull << 30;
  const std::uint64_t context = machine.worker_run({"info"}).number("driver_used");
  auto filled = [&](const Environment& extra) {
    return machine.worker_run({"fill", std::to_string(kChunk)}, extra).number("allocated");
  };
  const std::uint64_t by_default = filled({});
  EXPECT_LE(by_default + context, 4 * kGiB);
  EXPECT_GT(by_default + context + kChunk, 4 * kGiB);
  const std::uint64_t lowered = filled({{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=2G"}});
  EXPECT_LE(lowered + context, 2 * kGiB);
  EXPECT_GT(lowered + context + kChunk, 2 * kGiB);
  EXPECT_EQ(filled({{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=16G"}}), by_default);

  // A client holding memory when the daemon is killed: its next allocation fails.
  Running client({worker(), "two-step", std::to_string(kChunk), std::to_string(kChunk)},
                 machine.environment);
  ASSERT_EQ(client.read_line(), "result=0");
  daemon->kill_hard();
  ASSERT_EQ(daemon->wait(), 128 + SIGKILL);
  client.write_line("again");
  EXPECT_EQ(client.read_line(), "second_result=806");  // CUDA_ERROR_MPS_RPC_FAILURE
  client.close_stdin();
  client.wait();
  // Its socket is left behind, and nobody answers on it.
  EXPECT_EQ(machine.worker_run({"init"}).value("result"), "805");  // MPS_CONNECTION_FAILED
}

// How two processes that each ran `kernels` shared device 0, from the device's own record:
// over the time both had work there, each one's busy time, and the share of the SMs it ran on.
struct SharedRun {
  std::uint64_t window_ns = 0;
  std::uint64_t busy_ns[2] = {};
  double sm_share[2] = {};
  std::uint64_t median_piece_ns[2] = {};  // how long its kernels took in the window
};
SharedRun shared_run(const MpsMachine& machine, const Finished (&runs)[2]) {
  setenv("TESSERA_SIM_STATE", machine.scratch.file("simgpu").c_str(), 1);
  setenv("TESSERA_SIM_DEVICES", "H100", 1);
  sim::Machine record;
  ErrorText error;
  EXPECT_TRUE(record.attach(error)) << error.text;
  std::uint64_t from = 0, to = UINT64_MAX;
  std::int32_t pids[2];
  for (int i = 0; i < 2; ++i) {
    pids[i] = static_cast<std::int32_t>(runs[i].number("pid"));
    std::vector<sim::WorkPiece> pieces(1000);
    const int count = record.pieces(0, pids[i], 0, UINT64_MAX, pieces.data(), 1000);
    EXPECT_GT(count, 0);
    if (count <= 0) return {};
    std::uint64_t first = UINT64_MAX, last = 0;
    for (int k = 0; k < count && k < 1000; ++k) {
      first = std::min(first, pieces[static_cast<std::size_t>(k)].start_ns);
      last = std::max(last, pieces[static_cast<std::size_t>(k)].end_ns);
    }
    from = std::max(from, first);
    to = std::min(to, last);
  }
  SharedRun run;
  if (to <= from) return run;
  run.window_ns = to - from;
  for (int i = 0; i < 2; ++i) {
    const sim::BusyTime busy = record.busy(0, pids[i], from, to);
    run.busy_ns[i] = busy.process_ns;
    std::vector<sim::WorkPiece> pieces(1000);
    const int count = record.pieces(0, pids[i], from, to, pieces.data(), 1000);
    std::vector<std::uint64_t> lengths;
    for (int k = 0; k < count && k < 1000; ++k) {
      lengths.push_back(pieces[static_cast<std::size_t>(k)].end_ns -
                        pieces[static_cast<std::size_t>(k)].start_ns);
    }
    std::sort(lengths.begin(), lengths.end());
    if (!lengths.empty()) run.median_piece_ns[i] = lengths[lengths.size() / 2];
    run.sm_share[i] = busy.process_ns == 0 ? 0
                                           : static_cast<double>(busy.process_sm_ns) /
                                                 static_cast<double>(busy.process_ns);
  }
  return run;
}

// Two clients of one daemon at 50 % each run their kernels side by side, each on half the
// SMs (so a kernel as wide as the GPU takes two waves); without the daemon the same two
// processes time-slice the GPU. Launches are asynchronous, and the figures come from the
// device's record, so what the host does to the workers does not change them.
// Two processes launching 150 kernels of `blocks` blocks each at once, as the record saw them.
SharedRun two_clients(const MpsMachine& machine, const char* kernel, const char* blocks = "132") {
  std::unique_ptr<Running> workers[2];
  for (auto& running : workers) {
    running = std::make_unique<Running>(
        std::vector<std::string>{worker(), "kernels", "plain", kernel, "150", blocks},
        machine.environment);
  }
  Finished runs[2];
  for (int i = 0; i < 2; ++i) runs[i] = workers[i]->finish();
  for (const Finished& one : runs) EXPECT_EQ(one.exit_code, 0) << one.out;
  return shared_run(machine, runs);
}

TEST(MpsClient, ClientsRunSideBySideEachOnItsThreadPercentage) {
  MpsMachine machine;
  auto both = [&](const char* kernel) { return two_clients(machine, kernel); };
  // Time-sliced: together never busier than the device.
  const SharedRun sliced = both("k@2ms");
  ASSERT_GT(sliced.window_ns, 0u);
  EXPECT_LE(sliced.busy_ns[0] + sliced.busy_ns[1], sliced.window_ns + 1'000'000);
  EXPECT_DOUBLE_EQ(sliced.sm_share[0], 1.0);

  const std::unique_ptr<Running> daemon = machine.start_daemon();
  ASSERT_TRUE(machine.answers());
  ASSERT_EQ(machine.control("set_default_active_thread_percentage 50\n").out, "50.0\n");
  const SharedRun side_by_side = both("k@1ms");
  ASSERT_GT(side_by_side.window_ns, 100'000'000u);  // 150 kernels of two 1 ms waves each
  for (int i = 0; i < 2; ++i) {
    EXPECT_GE(side_by_side.busy_ns[i], side_by_side.window_ns * 9 / 10) << i;
    EXPECT_NEAR(side_by_side.sm_share[i], 0.5, 0.001) << i;
  }
  ASSERT_EQ(machine.control("quit\n").exit_code, 0);
  EXPECT_EQ(daemon->wait(), 0);
}

// Clients left at 100 % each, as MPS starts them without a limit: grids that fill the device
// share its SMs (together never more SM-time than it has), while one-block grids run side by
// side at full speed.
TEST(MpsClient, ClientsAskingMoreThanTheDeviceShareItsSmsAndSmallGridsDoNot) {
  MpsMachine machine;
  const std::unique_ptr<Running> daemon = machine.start_daemon();
  ASSERT_TRUE(machine.answers());
  const SharedRun full = two_clients(machine, "k@1ms");
  ASSERT_GT(full.window_ns, 0u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_DOUBLE_EQ(full.sm_share[i], 1.0) << i;
    EXPECT_GE(full.busy_ns[i], full.window_ns * 9 / 10) << i;  // side by side,
    EXPECT_EQ(full.median_piece_ns[i], 2'000'000u) << i;       // each at half speed
  }

  const SharedRun small = two_clients(machine, "k@1ms", "1");
  ASSERT_GT(small.window_ns, 0u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(small.sm_share[i], 1.0 / 132, 0.001) << i;
    EXPECT_GE(small.busy_ns[i], small.window_ns * 9 / 10) << i;
    EXPECT_EQ(small.median_piece_ns[i], 1'000'000u) << i;  // at full speed
  }
  ASSERT_EQ(machine.control("quit\n").exit_code, 0);
  EXPECT_EQ(daemon->wait(), 0);
}

}  // namespace
}  // namespace tessera::test
