// What the extender has decided, for /metrics (Prometheus text format 0.0.4): requests and
// their latency per verb, refusals, bind failures, and the size of the cluster state it keeps.
// Recorded from many request threads at once: counters only, no lock.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::extender {

enum class Verb { filter, prioritize, bind, preempt };
inline constexpr std::size_t kVerbCount = 4;

struct StateSize {
  std::size_t nodes = 0;      // nodes known, with their GPUs
  std::size_t pods_held = 0;  // pods holding GPUs, by their assignments and this extender's binds
  std::size_t pods_waiting = 0;  // pods waiting for a node, in FGD's target workload
  bool leading = true;           // this replica binds (it leads, or runs without election)
};

class ExtenderMetrics {
 public:
  // One answered request: how long it took, whether it was refused as malformed (HTTP 4xx or
  // 5xx), and for bind whether the bind failed (an answer with an Error).
  void record(Verb verb, std::chrono::nanoseconds took, bool refused, bool bind_failed);
  std::string render(const StateSize& state) const;

  // Upper bounds of the latency histogram's buckets, in seconds.
  static constexpr std::array<double, 12> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.5,    2.5};

 private:
  struct PerVerb {
    std::atomic<std::uint64_t> requests{0}, refused{0}, took_ns{0};
    std::array<std::atomic<std::uint64_t>, kBuckets.size()> within{};  // cumulative: le
  };
  std::array<PerVerb, kVerbCount> verbs_;
  std::atomic<std::uint64_t> bind_failures_{0};
};

}  // namespace tessera::extender
