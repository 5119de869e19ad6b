#include "extender/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "base/prometheus.h"

namespace tessera::extender {
namespace {

constexpr std::array<const char*, kVerbCount> kVerbNames = {"filter", "prioritize", "bind",
                                                            "preempt"};

}  // namespace

void ExtenderMetrics::record(Verb verb, std::chrono::nanoseconds took, bool refused,
                             bool bind_failed) {
  PerVerb& stats = verbs_[static_cast<std::size_t>(verb)];
  const auto nanoseconds = static_cast<std::uint64_t>(took.count() > 0 ? took.count() : 0);
  const double seconds = static_cast<double>(nanoseconds) / 1e9;
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) stats.within[i].fetch_add(1, std::memory_order_relaxed);
  }
  stats.took_ns.fetch_add(nanoseconds, std::memory_order_relaxed);
  if (refused) stats.refused.fetch_add(1, std::memory_order_relaxed);
  if (bind_failed) bind_failures_.fetch_add(1, std::memory_order_relaxed);
  // Counted last: a scrape never sees more buckets filled than requests.
  stats.requests.fetch_add(1, std::memory_order_release);
}

std::string ExtenderMetrics::render(const StateSize& state) const {
  base::Exposition out;
  // A counter per verb, from one member of each verb's figures.
  auto per_verb = [&](const char* name, const char* help,
                      std::atomic<std::uint64_t> PerVerb::*member) {
    out.family(name, "counter", help);
    for (std::size_t v = 0; v < verbs_.size(); ++v) {
      out.add(name, fmt::format("verb=\"{}\"", kVerbNames[v]),
              static_cast<double>((verbs_[v].*member).load(std::memory_order_acquire)));
    }
  };
  per_verb("tessera_extender_requests_total", "Requests answered, by verb.", &PerVerb::requests);
  per_verb("tessera_extender_refused_requests_total", "Requests refused as malformed, by verb.",
           &PerVerb::refused);
  constexpr const char* kDuration = "tessera_extender_request_duration_seconds";
  out.family(kDuration, "histogram", "Time to answer a request, by verb.");
  for (std::size_t v = 0; v < verbs_.size(); ++v) {
    const PerVerb& stats = verbs_[v];
    const std::uint64_t requests = stats.requests.load(std::memory_order_acquire);
    const std::string verb = fmt::format("verb=\"{}\"", kVerbNames[v]);
    for (std::size_t i = 0; i < kBuckets.size(); ++i) {
      out.add(
          fmt::format("{}_bucket", kDuration), fmt::format("{},le=\"{}\"", verb, kBuckets[i]),
          static_cast<double>(std::min(requests, stats.within[i].load(std::memory_order_relaxed))));
    }
    out.add(fmt::format("{}_bucket", kDuration), verb + ",le=\"+Inf\"",
            static_cast<double>(requests));
    out.add(fmt::format("{}_sum", kDuration), verb,
            static_cast<double>(stats.took_ns.load(std::memory_order_relaxed)) / 1e9);
    out.add(fmt::format("{}_count", kDuration), verb, static_cast<double>(requests));
  }
  out.family("tessera_extender_bind_failures_total", "counter",
             "Binds answered with an error (the pod no longer fits, the API server refused).");
  out.add("tessera_extender_bind_failures_total", "",
          static_cast<double>(bind_failures_.load(std::memory_order_relaxed)));
  const std::pair<const char*, const char*> gauges[] = {
      {"tessera_extender_nodes", "Nodes in the extender's cluster state."},
      {"tessera_extender_pods_holding_gpus", "Pods holding GPUs in the extender's cluster state."},
      {"tessera_extender_pods_waiting",
       "Pods waiting for a node, which FGD's target workload counts."},
      {"tessera_extender_leader", "1 if this replica binds: it leads, or runs alone."}};
  const double values[] = {static_cast<double>(state.nodes), static_cast<double>(state.pods_held),
                           static_cast<double>(state.pods_waiting), state.leading ? 1.0 : 0.0};
  for (std::size_t i = 0; i < std::size(gauges); ++i) {
    out.family(gauges[i].first, "gauge", gauges[i].second);
    out.add(gauges[i].first, "", values[i]);
  }
  return out.text();
}

}  // namespace tessera::extender
