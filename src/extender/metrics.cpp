#include "extender/metrics.h"

#include <fmt/format.h>

namespace tessera::extender {
namespace {

constexpr std::array<const char*, 3> kVerbNames = {"filter", "prioritize", "bind"};

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
  fmt::memory_buffer out;
  auto append = [&out](const std::string& text) { out.append(text); };
  // A counter per verb, from one member of each verb's figures.
  auto per_verb = [&](const char* name, const char* help,
                      std::atomic<std::uint64_t> PerVerb::*member) {
    append(fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name));
    for (std::size_t v = 0; v < verbs_.size(); ++v) {
      append(fmt::format("{}{{verb=\"{}\"}} {}\n", name, kVerbNames[v],
                         (verbs_[v].*member).load(std::memory_order_acquire)));
    }
  };
  per_verb("tessera_extender_requests_total", "Requests answered, by verb.", &PerVerb::requests);
  per_verb("tessera_extender_refused_requests_total", "Requests refused as malformed, by verb.",
           &PerVerb::refused);
  append(
      "# HELP tessera_extender_request_duration_seconds Time to answer a request, by verb.\n"
      "# TYPE tessera_extender_request_duration_seconds histogram\n");
  for (std::size_t v = 0; v < verbs_.size(); ++v) {
    const PerVerb& stats = verbs_[v];
    const std::uint64_t requests = stats.requests.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < kBuckets.size(); ++i) {
      append(fmt::format(
          "tessera_extender_request_duration_seconds_bucket{{verb=\"{}\",le=\"{}\"}} {}\n",
          kVerbNames[v], kBuckets[i],
          std::min(requests, stats.within[i].load(std::memory_order_relaxed))));
    }
    append(fmt::format(
        "tessera_extender_request_duration_seconds_bucket{{verb=\"{}\",le=\"+Inf\"}} {}\n"
        "tessera_extender_request_duration_seconds_sum{{verb=\"{}\"}} {:.9f}\n"
        "tessera_extender_request_duration_seconds_count{{verb=\"{}\"}} {}\n",
        kVerbNames[v], requests, kVerbNames[v],
        static_cast<double>(stats.took_ns.load(std::memory_order_relaxed)) / 1e9, kVerbNames[v],
        requests));
  }
  append(fmt::format(
      "# HELP tessera_extender_bind_failures_total Binds answered with an error (the pod no "
      "longer fits, the API server refused).\n"
      "# TYPE tessera_extender_bind_failures_total counter\n"
      "tessera_extender_bind_failures_total {}\n"
      "# HELP tessera_extender_nodes Nodes in the extender's cluster state.\n"
      "# TYPE tessera_extender_nodes gauge\n"
      "tessera_extender_nodes {}\n"
      "# HELP tessera_extender_pods_holding_gpus Pods holding GPUs in the extender's cluster "
      "state.\n"
      "# TYPE tessera_extender_pods_holding_gpus gauge\n"
      "tessera_extender_pods_holding_gpus {}\n"
      "# HELP tessera_extender_pods_waiting Pods waiting for a node, which FGD's target "
      "workload counts.\n"
      "# TYPE tessera_extender_pods_waiting gauge\n"
      "tessera_extender_pods_waiting {}\n"
      "# HELP tessera_extender_leader 1 if this replica binds: it leads, or runs alone.\n"
      "# TYPE tessera_extender_leader gauge\n"
      "tessera_extender_leader {}\n",
      bind_failures_.load(std::memory_order_relaxed), state.nodes, state.pods_held,
      state.pods_waiting, state.leading ? 1 : 0));
  return fmt::to_string(out);
}

}  // namespace tessera::extender
