// tessera top: each sharing group's memory and compute on each device, read from the ledgers.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/environment.h"
#include "common/clock.h"
#include "common/units.h"
#include "ledger/ledger.h"

namespace tessera::cli {
namespace {

// One row per group and device that has a limit or has seen use.
nlohmann::json snapshot(const std::string& directory) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (entry.path().extension() == ".ledger") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& file : files) {
    ledger::Ledger ledger;
    ErrorText error;
    if (!ledger.open(file.c_str(), error)) {
      rows.push_back({{"group", file.stem().string()}, {"error", error.text}});
      continue;
    }
    const int members = ledger.live_members();
    nlohmann::json group_rows = nlohmann::json::array();
    for (int device = 0; device < kMostDevices; ++device) {
      const ledger::DeviceUsage usage = ledger.usage(device);
      if (usage.limit == kUnlimited && usage.peak == 0 && usage.cores == 0 && usage.held_ns == 0 &&
          (ledger.group_priority() == Priority::none || device > 0)) {
        continue;  // nothing limits or holds the group here
      }
      if (device > 0 && usage.peak == 0 && usage.used == 0 &&
          usage.limit == ledger.effective_limit(0)) {
        continue;  // the same limit on every device: show the ones in use, and device 0
      }
      group_rows.push_back({{"group", ledger.file()->group_name},
                            {"device", device},
                            {"limit", usage.limit},
                            {"used", usage.used},
                            {"peak", usage.peak},
                            {"refused", usage.rejections},
                            {"cores", usage.cores},
                            {"priority", priority_name(ledger.group_priority())},
                            {"throttled_ms", usage.throttled_ns / 1000000},
                            {"held_for_priority_ms", usage.held_ns / 1000000},
                            {"device_time_ns", usage.device_time_ns},
                            {"members", members}});
    }
    if (const char* damage = ledger.damage(); damage != nullptr) {
      rows.push_back({{"group", file.stem().string()}, {"error", damage}});
    } else {
      rows.insert(rows.end(), group_rows.begin(), group_rows.end());
    }
  }
  return rows;
}

// Adds each row's achieved share: the device time its launches were granted between the
// two snapshots, as a percentage of the time between them. A group absent from the first
// snapshot was created since, so all its granted time falls in between.
void add_achieved(nlohmann::json& rows, const nlohmann::json& before, std::uint64_t elapsed_ns) {
  for (auto& row : rows) {
    if (row.contains("error")) continue;
    const auto now_total = row["device_time_ns"].get<std::uint64_t>();
    std::uint64_t then_total = 0;
    for (const auto& old : before) {
      if (!old.contains("error") && old["group"] == row["group"] && old["device"] == row["device"])
        then_total = old["device_time_ns"].get<std::uint64_t>();
    }
    // A total that went down belongs to a ledger made again under the same name.
    const std::uint64_t granted = now_total >= then_total ? now_total - then_total : now_total;
    row["achieved_percent"] =
        100.0 * static_cast<double>(granted) / static_cast<double>(elapsed_ns);
  }
}

void print_table(const nlohmann::json& rows) {
  fmt::print("{:<20}{:>7}{:>13}{:>13}{:>13}{:>9}{:>7}{:>10}{:>12}{:>12}{:>10}{:>9}\n", "GROUP",
             "DEVICE", "LIMIT", "USED", "PEAK", "REFUSED", "CORES", "ACHIEVED", "THROTTLED", "HELD",
             "PRIORITY", "MEMBERS");
  for (const auto& row : rows) {
    if (row.contains("error")) {
      fmt::print("{:<20} unreadable: {}\n", row["group"].get<std::string>(),
                 row["error"].get<std::string>());
      continue;
    }
    const auto limit = row["limit"].get<std::uint64_t>();
    const auto cores = row["cores"].get<std::uint32_t>();
    fmt::print("{:<20}{:>7}{:>13}{:>13}{:>13}{:>9}{:>7}{:>10}{:>12}{:>12}{:>10}{:>9}\n",
               row["group"].get<std::string>(), row["device"].get<int>(),
               limit == kUnlimited ? std::string("none") : human_size(limit),
               human_size(row["used"].get<std::uint64_t>()),
               human_size(row["peak"].get<std::uint64_t>()), row["refused"].get<std::uint64_t>(),
               cores == 0 ? std::string("-") : fmt::format("{}%", cores),
               fmt::format("{:.1f}%", row["achieved_percent"].get<double>()),
               fmt::format("{} ms", row["throttled_ms"].get<std::uint64_t>()),
               fmt::format("{} ms", row["held_for_priority_ms"].get<std::uint64_t>()),
               row["priority"].get<std::string>(), row["members"].get<int>());
  }
}

}  // namespace

int top_command(const TopOptions& options) {
  const std::string directory = runtime_directory();
  const auto interval = std::chrono::duration<double>(options.interval_seconds);
  // The achieved share is measured over one interval, so even --once watches for one.
  nlohmann::json before = snapshot(directory);
  std::uint64_t before_ns = monotonic_ns();
  for (;;) {
    std::this_thread::sleep_for(interval);
    nlohmann::json rows = snapshot(directory);
    const std::uint64_t now_ns = monotonic_ns();
    add_achieved(rows, before, now_ns - before_ns);
    if (options.json) {
      // Names come from file names and files: bytes that are not UTF-8 are shown replaced.
      fmt::print("{}\n", rows.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    } else {
      if (!options.once) fmt::print("\033[H\033[2J");
      print_table(rows);
    }
    if (options.once) return 0;
    std::fflush(stdout);
    before = std::move(rows);
    before_ns = now_ns;
  }
}

}  // namespace tessera::cli
