#include "device_record.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "host_record.h"

namespace tessera::test {

void attach_to_device_record(const ScratchDirectory& scratch, sim::Machine& machine,
                             const char* devices) {
  setenv("TESSERA_SIM_STATE", scratch.file("simgpu").c_str(), 1);
  setenv("TESSERA_SIM_DEVICES", devices, 1);
  ErrorText error;
  EXPECT_TRUE(machine.attach(error)) << error.text;
}

double share_of(const ScratchDirectory& scratch, const std::vector<std::int32_t>& pids,
                std::uint64_t from, std::uint64_t to, int device, const char* devices) {
  sim::Machine machine;
  attach_to_device_record(scratch, machine, devices);
  std::uint64_t busy = 0;
  for (std::int32_t pid : pids) {
    const sim::BusyTime record = machine.busy(device, pid, from, to);
    EXPECT_TRUE(record.complete);
    busy += record.process_ns;
  }
  return static_cast<double>(busy) / static_cast<double>(to - from);
}

std::vector<std::uint64_t> completion_latencies(const ScratchDirectory& scratch,
                                                const Finished& done, std::uint64_t settle_ns,
                                                int device, const char* devices) {
  const std::vector<std::uint64_t> launched = done.numbers("launched_ns");
  const std::vector<std::uint64_t> call_delay = done.numbers("call_delay_ns");
  EXPECT_EQ(call_delay.size(), launched.size());
  if (call_delay.size() != launched.size()) return {};
  sim::Machine machine;
  attach_to_device_record(scratch, machine, devices);
  std::vector<sim::WorkPiece> pieces(launched.size() + 1);
  const int count =
      machine.pieces(device, static_cast<std::int32_t>(done.number("pid")), done.number("begin_ns"),
                     done.number("end_ns"), pieces.data(), static_cast<int>(pieces.size()));
  EXPECT_EQ(count, static_cast<int>(launched.size()));
  if (count != static_cast<int>(launched.size())) return {};
  std::vector<std::uint64_t> latencies;
  for (std::size_t i = 0; i < launched.size(); ++i) {
    if (launched[i] < done.number("begin_ns") + settle_ns) continue;
    const std::uint64_t latency = pieces[i].end_ns - launched[i];
    latencies.push_back(latency > call_delay[i] ? latency - call_delay[i] : 0);
  }
  std::sort(latencies.begin(), latencies.end());
  return latencies;
}

std::uint64_t percentile(const std::vector<std::uint64_t>& sorted, int percent) {
  return sorted.empty() ? 0 : sorted[sorted.size() * static_cast<std::size_t>(percent) / 100];
}

double least_share(double percent, double allowed) {
  return percent * allowed * 0.95 - 1.0;
}

void expect_burst_given_back(const ScratchDirectory& scratch, const Finished& burster,
                             const Finished& newcomer, int device, const char* devices) {
  constexpr std::uint64_t kSettleNs = 300'000'000;  // costs are being learned
  const auto burster_pid = static_cast<std::int32_t>(burster.number("pid"));
  const auto newcomer_pid = static_cast<std::int32_t>(newcomer.number("pid"));
  const std::uint64_t arrival = newcomer.number("begin_ns");
  const HostRecord burster_host = burster.host(), newcomer_host = newcomer.host();
  const std::uint64_t lone_from = burster.number("begin_ns") + kSettleNs;
  const double lone = 100 * share_of(scratch, {burster_pid}, lone_from, arrival, device, devices);
  const double lone_allowed = burster_host.allowed(lone_from, arrival);
  EXPECT_GT(lone, 95 * lone_allowed) << "the host let it run " << 100 * lone_allowed << " %";
  const std::uint64_t from = arrival + 100'000'000, to = arrival + 700'000'000;
  const double joined = 100 * share_of(scratch, {newcomer_pid}, from, to, device, devices);
  const double shared = 100 * share_of(scratch, {burster_pid}, from, to, device, devices);
  const double newcomer_allowed = newcomer_host.allowed(from, to);
  const double burster_allowed = burster_host.allowed(from, to);
  EXPECT_LE(joined, 72.0) << "the newcomer's cap";
  EXPECT_GE(joined, least_share(70, newcomer_allowed))
      << "the host let the newcomer run " << 100 * newcomer_allowed << " %";
  EXPECT_GE(shared, least_share(30, burster_allowed))
      << "the host let the burster run " << 100 * burster_allowed << " %";
  EXPECT_LE(shared, 32.0 + 100 * (1 - newcomer_allowed))
      << "the host let the newcomer run " << 100 * newcomer_allowed << " %";
  report("burster_alone", lone);
  report("burster_shared", shared);
  report("newcomer_shared", joined);
  report("host_allowed_newcomer", 100 * newcomer_allowed);
  std::printf("alone %.1f %%, then %.1f %% beside the newcomer's %.1f %%\n", lone, shared, joined);
}

void report(const std::string& key, double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", value);
  ::testing::Test::RecordProperty(key, text);
}

}  // namespace tessera::test
