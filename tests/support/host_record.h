// What the host withheld from a process: the time its launching thread was ready to run but
// kept off the CPU (the kernel's run-queue delay for the thread, /proc/<pid>/task/<tid>/
// schedstat) plus the machine's steal time (/proc/stat, time the hypervisor ran someone
// else). On a busy or shared machine a workload can only use the device while the host lets
// it run, so the timing tests judge every lower bound (a share reached, a lone group near
// 100 %) against the fraction of the window the host allowed, and every upper bound (a cap)
// against nothing at all.
//
// HostRecorder runs in the worker: it samples both counters every millisecond on a thread of
// its own and prints them as one "host=" line. HostRecord reads that line in the test.
#pragma once

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace tessera::test {

struct HostSample {
  std::uint64_t at_ns;     // CLOCK_MONOTONIC
  std::uint64_t delay_ns;  // the thread's run-queue delay so far
  std::uint64_t steal_ns;  // the machine's steal time so far, all CPUs
};

// Reads the counters of the thread whose schedstat file is open as `schedstat`.
inline HostSample sample_host(int schedstat, int machine_stat) {
  HostSample sample{monotonic_ns(), 0, 0};
  char text[4096];
  ssize_t length = pread(schedstat, text, sizeof text - 1, 0);
  if (length > 0) {
    text[length] = '\0';
    unsigned long long on_cpu = 0, waiting = 0;
    if (std::sscanf(text, "%llu %llu", &on_cpu, &waiting) == 2) sample.delay_ns = waiting;
  }
  length = pread(machine_stat, text, sizeof text - 1, 0);
  if (length > 0) {
    text[length] = '\0';
    unsigned long long field[8] = {};
    if (std::sscanf(text, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &field[0], &field[1],
                    &field[2], &field[3], &field[4], &field[5], &field[6], &field[7]) == 8) {
      sample.steal_ns =
          field[7] * (1'000'000'000ull / static_cast<unsigned long long>(sysconf(_SC_CLK_TCK)));
    }
  }
  return sample;
}

// Samples the constructing thread until destroyed; print() writes the "host=" line.
class HostRecorder {
 public:
  HostRecorder() {
    const auto tid = static_cast<long>(syscall(SYS_gettid));
    const std::string path = "/proc/self/task/" + std::to_string(tid) + "/schedstat";
    schedstat_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    machine_stat_ = open("/proc/stat", O_RDONLY | O_CLOEXEC);
    samples_.reserve(1 << 16);
    samples_.push_back(sample_host(schedstat_, machine_stat_));
    sampler_ = std::thread([this] {
      for (std::uint64_t next = monotonic_ns(); !stop_.load(std::memory_order_relaxed);) {
        next += 1'000'000;
        sleep_until_ns(next);
        const HostSample sample = sample_host(schedstat_, machine_stat_);
        if (samples_.size() < samples_.capacity()) samples_.push_back(sample);
        if (next < sample.at_ns) next = sample.at_ns;  // fell behind: no burst of catch-up samples
      }
    });
  }
  ~HostRecorder() {
    stop();
    if (schedstat_ >= 0) close(schedstat_);
    if (machine_stat_ >= 0) close(machine_stat_);
  }
  HostRecorder(const HostRecorder&) = delete;
  HostRecorder& operator=(const HostRecorder&) = delete;

  void print() {
    stop();
    samples_.push_back(sample_host(schedstat_, machine_stat_));
    std::string line = "host=";
    char entry[80];
    for (const HostSample& sample : samples_) {
      std::snprintf(entry, sizeof entry, "%llu:%llu:%llu,",
                    static_cast<unsigned long long>(sample.at_ns),
                    static_cast<unsigned long long>(sample.delay_ns),
                    static_cast<unsigned long long>(sample.steal_ns));
      line += entry;
    }
    std::printf("%s\n", line.c_str());
  }

 private:
  void stop() {
    stop_ = true;
    if (sampler_.joinable()) sampler_.join();
  }
  int schedstat_ = -1, machine_stat_ = -1;
  std::vector<HostSample> samples_;
  std::atomic<bool> stop_{false};
  std::thread sampler_;
};

// A worker's host= line, read back.
class HostRecord {
 public:
  explicit HostRecord(const std::string& line) {
    const char* cursor = line.c_str();
    while (*cursor != '\0') {
      unsigned long long at = 0, delay = 0, steal = 0;
      int used = 0;
      if (std::sscanf(cursor, "%llu:%llu:%llu,%n", &at, &delay, &steal, &used) != 3 || used == 0) {
        break;
      }
      samples_.push_back({at, delay, steal});
      cursor += used;
    }
  }
  bool empty() const { return samples_.size() < 2; }

  // Time within [from, to) the host kept the thread from running.
  std::uint64_t withheld(std::uint64_t from, std::uint64_t to) const {
    if (to <= from) return 0;
    const double kept = at(to) - at(from);
    const double most = static_cast<double>(to - from);
    return static_cast<std::uint64_t>(std::clamp(kept, 0.0, most));
  }
  // The fraction of [from, to) the host let the thread run, from 0 to 1.
  double allowed(std::uint64_t from, std::uint64_t to) const {
    if (to <= from) return 1;
    return 1 - static_cast<double>(withheld(from, to)) / static_cast<double>(to - from);
  }

 private:
  // Run-queue delay plus steal accrued by `time`, interpolated between samples.
  double at(std::uint64_t time) const {
    if (samples_.empty()) return 0;
    auto total = [](const HostSample& sample) {
      return static_cast<double>(sample.delay_ns) + static_cast<double>(sample.steal_ns);
    };
    if (time <= samples_.front().at_ns) return total(samples_.front());
    if (time >= samples_.back().at_ns) return total(samples_.back());
    const auto after = std::upper_bound(
        samples_.begin(), samples_.end(), time,
        [](std::uint64_t when, const HostSample& sample) { return when < sample.at_ns; });
    const HostSample& before = *(after - 1);
    const double fraction =
        static_cast<double>(time - before.at_ns) / static_cast<double>(after->at_ns - before.at_ns);
    return total(before) + fraction * (total(*after) - total(before));
  }

  std::vector<HostSample> samples_;
};

}  // namespace tessera::test
