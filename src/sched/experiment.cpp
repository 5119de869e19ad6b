#include "sched/experiment.h"

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

namespace tessera::sched {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The cluster in a seeded random order, fixed for the run. The engine takes the first of
// equally scored nodes, so this order is the tie-break; the paper's simulator keeps its nodes
// in no particular order (in a Go map), and its published figures are reproduced this way
// (docs/scheduler.md), not with the trace's own order, nor with ties broken at random.
std::vector<NodeSpec> in_run_order(std::vector<NodeSpec> nodes, std::mt19937_64& random) {
  std::shuffle(nodes.begin(), nodes.end(), random);
  return nodes;
}

// Arrivals a run may simulate: a trace that needs more to reach its load is refused.
constexpr double kMostArrivals = 50'000'000;

std::int64_t gpu_capacity_milli(const std::vector<NodeSpec>& nodes) {
  std::int64_t capacity = 0;
  for (const NodeSpec& node : nodes) capacity += std::int64_t{node.gpus} * kMilli;
  return capacity;
}

void require(const std::string& why) {
  if (!why.empty()) throw std::invalid_argument(why);
}

}  // namespace

std::string why_not_a_cluster(const std::vector<NodeSpec>& nodes) {
  if (gpu_capacity_milli(nodes) == 0) return "no node in the list has a GPU";
  std::set<std::string> models;
  for (const NodeSpec& node : nodes) {
    if (node.gpus > 0) models.insert(node.model);
  }
  if (models.size() > static_cast<std::size_t>(Cluster::kMostModels)) {
    return fmt::format("the nodes have {} GPU models; the engine holds at most {}", models.size(),
                       Cluster::kMostModels);
  }
  return {};
}

std::string why_not_inflatable(const std::vector<NodeSpec>& nodes,
                               const std::vector<PodSpec>& trace, double max_load) {
  double requested = 0;
  for (const PodSpec& pod : trace) requested += static_cast<double>(pod.gpu_milli_total());
  if (trace.empty() || requested == 0) {
    return "no pod in the trace asks for a GPU, so no GPU load can arrive";
  }
  const double per_pod = requested / static_cast<double>(trace.size());
  const double arrivals = max_load * static_cast<double>(gpu_capacity_milli(nodes)) / per_pod;
  if (arrivals > kMostArrivals) {
    return fmt::format(
        "its pods ask for {:.3g} milli-GPU each on average: reaching {:.0f} % of the cluster's "
        "GPUs would take about {:.3g} arrivals, and at most {:.0f} are simulated",
        per_pod, 100 * max_load, arrivals, kMostArrivals);
  }
  return {};
}

std::string why_not_replayable(const std::vector<PodSpec>& trace) {
  for (const PodSpec& pod : trace) {
    if (pod.creation_time < 0) {
      return fmt::format("pod {} has no creation time: this trace cannot be replayed in time",
                         pod.name);
    }
  }
  return {};
}

double RunResult::allocated_at(double load) const {
  for (const CurvePoint& point : curve) {
    if (point.arrived >= load - 1e-9) return point.allocated;
  }
  return curve.empty() ? 0 : curve.back().allocated;
}

RunResult run_inflation(const std::vector<NodeSpec>& nodes, const std::vector<PodSpec>& trace,
                        Policy policy, std::uint64_t seed, double max_load, Workload workload) {
  require(why_not_a_cluster(nodes));
  require(why_not_inflatable(nodes, trace, max_load));
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 random(seed);
  Cluster cluster(in_run_order(nodes, random));
  cluster.set_target_workload(trace);
  std::uniform_int_distribution<std::size_t> pick(0, trace.size() - 1);
  RunResult result{policy, seed, {}, 0, 0, 0};
  const double capacity = static_cast<double>(cluster.gpu_milli_total());
  double arrived = 0;
  int next_percent = 1;
  std::vector<std::size_t> shuffled;
  if (workload == Workload::trace_then_sample) {
    for (std::size_t i = 0; i < trace.size(); ++i) shuffled.push_back(i);
    std::shuffle(shuffled.begin(), shuffled.end(), random);
  }
  std::size_t next_in_trace = 0;
  while (arrived < max_load * capacity) {
    const PodSpec& pod =
        next_in_trace < shuffled.size() ? trace[shuffled[next_in_trace++]] : trace[pick(random)];
    const Request request = cluster.request_for(pod);
    arrived += static_cast<double>(pod.gpu_milli_total());
    const Placement placement = cluster.place(request, policy, random);
    if (placement.node >= 0) {
      cluster.allocate(request, placement);
      ++result.placed;
    } else {
      ++result.pending;
    }
    while (arrived >= next_percent / 100.0 * capacity) {
      result.curve.push_back({next_percent / 100.0,
                              static_cast<double>(cluster.gpu_milli_allocated()) / capacity,
                              next_percent % 5 == 0 ? cluster.fragmentation() / capacity : -1});
      ++next_percent;
    }
  }
  result.seconds = seconds_since(start);
  return result;
}

RunResult run_replay(const std::vector<NodeSpec>& nodes, const std::vector<PodSpec>& trace,
                     Policy policy, std::uint64_t seed) {
  require(why_not_a_cluster(nodes));
  require(why_not_replayable(trace));
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 random(seed);
  Cluster cluster(in_run_order(nodes, random));
  cluster.set_target_workload(trace);
  struct Event {
    std::int64_t time;
    bool arrival;
    std::size_t pod;
  };
  std::vector<Event> events;
  for (std::size_t i = 0; i < trace.size(); ++i) {
    events.push_back({trace[i].creation_time, true, i});
    if (trace[i].deletion_time >= 0) events.push_back({trace[i].deletion_time, false, i});
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.time < b.time || (a.time == b.time && !a.arrival && b.arrival);  // leave first
  });
  std::vector<Placement> placements(trace.size());
  RunResult result{policy, seed, {}, 0, 0, 0};
  const double capacity = static_cast<double>(cluster.gpu_milli_total());
  double alive = 0;
  for (std::size_t k = 0; k < events.size(); ++k) {
    const Event& event = events[k];
    const PodSpec& pod = trace[event.pod];
    const Request request = cluster.request_for(pod);
    if (event.arrival) {
      alive += static_cast<double>(pod.gpu_milli_total());
      placements[event.pod] = cluster.place(request, policy, random);
      if (placements[event.pod].node >= 0) {
        cluster.allocate(request, placements[event.pod]);
        ++result.placed;
      } else {
        ++result.pending;
      }
    } else {
      alive -= static_cast<double>(pod.gpu_milli_total());
      if (placements[event.pod].node >= 0) cluster.release(request, placements[event.pod]);
    }
    if (k % 100 == 0 || k + 1 == events.size()) {
      result.curve.push_back(
          {alive / capacity, static_cast<double>(cluster.gpu_milli_allocated()) / capacity, -1});
    }
  }
  result.seconds = seconds_since(start);
  return result;
}

std::vector<RunResult> run_all(const std::vector<Job>& jobs, int threads,
                               const std::function<RunResult(const Job&)>& run,
                               const std::function<void(const RunResult&, int done)>& progress) {
  std::vector<RunResult> results(jobs.size());
  std::atomic<std::size_t> next{0};
  std::mutex report;
  int done = 0;
  std::exception_ptr failure;  // the first job's exception: none may escape a thread
  std::vector<std::thread> workers;
  for (int t = 0; t < std::max(1, threads); ++t) {
    workers.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        try {
          results[i] = run(jobs[i]);
          std::lock_guard<std::mutex> locked(report);
          progress(results[i], ++done);
        } catch (...) {
          std::lock_guard<std::mutex> locked(report);
          if (!failure) failure = std::current_exception();
          next = jobs.size();  // start nothing more
        }
      }
    });
  }
  for (auto& worker : workers) worker.join();
  if (failure) std::rethrow_exception(failure);
  return results;
}

std::string plot_svg(const std::vector<RunResult>& results) {
  constexpr double kWidth = 720, kHeight = 440, kLeft = 60, kBottom = 50, kTop = 20, kRight = 170;
  static const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                   "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  // Mean curve per policy over its seeds.
  std::map<std::string, std::vector<std::pair<double, double>>> sums;
  std::map<std::string, int> runs;
  for (const RunResult& result : results) {
    auto& sum = sums[policy_name(result.policy)];
    if (sum.size() < result.curve.size()) sum.resize(result.curve.size());
    for (std::size_t i = 0; i < result.curve.size(); ++i) {
      sum[i].first = result.curve[i].arrived;
      sum[i].second += result.curve[i].allocated;
    }
    ++runs[policy_name(result.policy)];
  }
  const double x_max = 1.3, y_min = 0.5, y_max = 1.0;
  auto x = [&](double v) { return kLeft + (kWidth - kLeft - kRight) * std::min(v, x_max) / x_max; };
  auto y = [&](double v) {
    return kHeight - kBottom -
           (kHeight - kBottom - kTop) * (std::clamp(v, y_min, y_max) - y_min) / (y_max - y_min);
  };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, kHeight);
  for (int tick = 0; tick <= 13; tick += 1) {
    const double v = tick / 10.0;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        x(v), kTop, kHeight - kBottom, kHeight - kBottom + 16, tick * 10);
  }
  for (int tick = 50; tick <= 100; tick += 10) {
    const double v = tick / 100.0;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#eee\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        kLeft, y(v), kWidth - kRight, kLeft - 6, y(v) + 4, tick);
  }
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">arrived GPU load (% of capacity)</text>\n",
      (kLeft + kWidth - kRight) / 2, kHeight - 12);
  svg += fmt::format(
      "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">GPU "
      "allocation ratio (%)</text>\n",
      (kTop + kHeight - kBottom) / 2, (kTop + kHeight - kBottom) / 2);
  int colour = 0;
  for (const auto& [name, sum] : sums) {
    std::string points;
    for (const auto& [arrived, allocated] : sum) {
      if (allocated / runs[name] < y_min) continue;  // below the plotted range: not drawn
      points += fmt::format("{:.1f},{:.1f} ", x(arrived), y(allocated / runs[name]));
    }
    const char* stroke = kColours[colour % 8];
    svg +=
        fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" points=\"{}\"/>\n",
                    stroke, points);
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"/>"
        "<text x=\"{4}\" y=\"{5}\">{6}</text>\n",
        kWidth - kRight + 12, kTop + 14 + 18 * colour, kWidth - kRight + 32, stroke,
        kWidth - kRight + 38, kTop + 18 + 18 * colour, name);
    ++colour;
  }
  return svg + "</svg>\n";
}

}  // namespace tessera::sched
