#include "sched/experiment.h"

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "base/mutex.h"

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

// The pods that arrive in a run, one at a time: the whole trace in a seeded random order and
// then pods sampled from it (Workload::trace_then_sample), or only sampled pods.
class Arrivals {
 public:
  Arrivals(const std::vector<PodSpec>& trace, Workload workload, std::mt19937_64& random)
      : random_(random), pick_(0, trace.size() - 1) {
    if (workload == Workload::trace_then_sample) {
      for (std::size_t i = 0; i < trace.size(); ++i) order_.push_back(i);
      std::shuffle(order_.begin(), order_.end(), random);
    }
  }
  std::size_t next() { return next_ < order_.size() ? order_[next_++] : pick_(random_); }

 private:
  std::mt19937_64& random_;
  std::uniform_int_distribution<std::size_t> pick_;
  std::vector<std::size_t> order_;
  std::size_t next_ = 0;
};

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

namespace {

// Preemption in a run: the pods placed, by node, and the eviction that lets a pod in.
class Evictions {
 public:
  explicit Evictions(std::size_t nodes) : on_node_(nodes) {}
  void placed(const Request& request, const Placement& placement, std::int32_t priority) {
    on_node_[static_cast<std::size_t>(placement.node)].push_back({request, placement, priority});
  }
  // Evicts the fewest pods of lower priority on the node where that takes fewest (then the
  // lowest priorities, then the first) and places the pod there: the victims, or -1 where no
  // eviction makes room.
  long make_room(Cluster& cluster, const Request& request, std::int32_t priority, Policy policy,
                 std::mt19937_64& random) {
    int chosen_node = -1;
    std::vector<std::size_t> chosen;
    std::int32_t chosen_highest = 0;
    for (std::size_t node = 0; node < on_node_.size(); ++node) {
      const auto victims =
          cluster.preemption_victims(static_cast<int>(node), request, priority, on_node_[node]);
      if (!victims) continue;
      const std::int32_t highest = highest_priority(*victims, on_node_[node]);
      if (chosen_node < 0 || victims->size() < chosen.size() ||
          (victims->size() == chosen.size() && highest < chosen_highest)) {
        chosen_node = static_cast<int>(node);
        chosen = *victims;
        chosen_highest = highest;
      }
    }
    if (chosen_node < 0) return -1;
    std::vector<Occupant>& here = on_node_[static_cast<std::size_t>(chosen_node)];
    for (auto victim = chosen.rbegin(); victim != chosen.rend(); ++victim) {  // indices fall
      cluster.release(here[*victim].request, here[*victim].placement);
      here.erase(here.begin() + static_cast<std::ptrdiff_t>(*victim));
    }
    const Placement placement = cluster.place_on(chosen_node, request, policy, random);
    if (placement.node != chosen_node) {  // preemption_victims promised room
      throw std::logic_error("preemption made no room on the node it chose");
    }
    cluster.allocate(request, placement);
    placed(request, placement, priority);
    return static_cast<long>(chosen.size());
  }

 private:
  std::vector<std::vector<Occupant>> on_node_;
};

}  // namespace

RunResult run_inflation(const std::vector<NodeSpec>& nodes, const std::vector<PodSpec>& trace,
                        Policy policy, std::uint64_t seed, double max_load, Workload workload,
                        bool preemption, const DynamicMigOptions* mig) {
  require(why_not_a_cluster(nodes));
  require(why_not_inflatable(nodes, trace, max_load));
  if (mig != nullptr && preemption) {
    throw std::invalid_argument("preemption on MIG-capable GPUs is not simulated");
  }
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 random(seed);
  std::vector<NodeSpec> ordered = in_run_order(nodes, random);
  if (mig != nullptr) ordered = DynamicMig::with_mig_profiles(std::move(ordered), *mig->model);
  Cluster cluster(ordered);
  cluster.set_target_workload(trace);
  std::optional<DynamicMig> dynamic;
  if (mig != nullptr) {
    dynamic.emplace(cluster, ordered, *mig);
    dynamic->set_target_workload(trace);
  }
  RunResult result{policy, policy_name(policy), seed, {}, 0, 0, 0};
  const double capacity = static_cast<double>(cluster.gpu_milli_total());
  double arrived = 0;
  int next_percent = 1;
  Arrivals arrivals(trace, workload, random);
  Evictions evictions(preemption ? cluster.nodes().size() : 0);
  while (arrived < max_load * capacity) {
    const PodSpec& pod = trace[arrivals.next()];
    const Request request = cluster.request_for(pod);
    const std::int32_t priority = priority_of_qos(pod.qos);
    arrived += static_cast<double>(cluster.asked_milli(request));
    Placement placement = cluster.place(request, policy, random);
    if (placement.node < 0 && dynamic) {
      if (const int node = dynamic->make_room(request); node >= 0) {
        placement = cluster.place_on(node, request, policy, random);
        if (placement.node != node) throw std::logic_error("dynamic MIG made no room");
      }
    }
    if (placement.node >= 0) {
      cluster.allocate(request, placement);
      if (dynamic && request.mig_asks > 0) dynamic->take(request, placement);
      if (preemption) evictions.placed(request, placement, priority);
      ++result.placed;
    } else if (const long victims =
                   preemption ? evictions.make_room(cluster, request, priority, policy, random)
                              : -1;
               victims >= 0) {
      ++result.placed;
      ++result.preemptions;
      result.victims += victims;
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
  if (dynamic) {
    result.mig_recuts = dynamic->recuts();
    result.mig_mode_changes = dynamic->mode_changes();
    result.mig_unavailable_gpu_seconds = dynamic->unavailable_gpu_seconds();
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
  RunResult result{policy, policy_name(policy), seed, {}, 0, 0, 0};
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

std::string reference_name(Reference reference) {
  return reference == Reference::bound ? "bound" : "offline-packer";
}

namespace {

// Places `request` where it fits tightest: least GPU left on the GPU(s) it takes, then least
// CPU left on the node. False if it fits nowhere.
bool place_tightest(Cluster& cluster, const Request& request) {
  const std::vector<Node>& nodes = cluster.nodes();
  Placement best;
  std::int64_t best_gpu_left = 0, best_cpu_left = 0;
  for (int index = 0; index < static_cast<int>(nodes.size()); ++index) {
    const Node& node = nodes[index];
    if (!cluster.fits(node, request)) continue;
    Placement candidate;
    candidate.node = index;
    std::int64_t gpu_left = 0;
    if (request.shares_gpu()) {
      int tightest = -1;
      for (int i = 0; i < node.gpus; ++i) {
        if (node.takes(i, request.gpu_milli) &&
            (tightest < 0 || node.gpu_left[i] < node.gpu_left[tightest])) {
          tightest = i;
        }
      }
      candidate.gpu_index[candidate.gpu_count++] = tightest;
      gpu_left = node.gpu_left[tightest] - request.gpu_milli;
    } else {
      for (int i = 0; i < node.gpus && candidate.gpu_count < request.gpus; ++i) {
        if (node.gpu_left[i] == kMilli) candidate.gpu_index[candidate.gpu_count++] = i;
      }
      gpu_left = node.fully_free_gpus() - request.gpus;
    }
    const std::int64_t cpu_left = node.cpu_left - request.cpu_milli;
    if (best.node < 0 || gpu_left < best_gpu_left ||
        (gpu_left == best_gpu_left && cpu_left < best_cpu_left)) {
      best = candidate;
      best_gpu_left = gpu_left;
      best_cpu_left = cpu_left;
    }
  }
  if (best.node < 0) return false;
  cluster.allocate(request, best);
  return true;
}

// Fills each GPU with room left by the sharing pods whose sizes add up closest to that room
// (a subset sum over the sizes still unplaced, in 10-milli steps) within the GPU's share of
// its node's CPU and memory; among ways to a sum, the one asking least of both (each relative
// to the share), each size at its lightest pod's. Placed pods are taken out of `sharing`.
void fill_gpus(Cluster& cluster, std::vector<Request>& sharing, long& placed) {
  constexpr int kStep = 10, kUnits = kMilli / kStep;
  // Unplaced pods by size in steps.
  std::vector<std::vector<Request>> by_size(kUnits + 1);
  std::vector<Request> odd;  // sizes off the 10-milli grid: placed afterwards
  for (const Request& request : sharing) {
    if (request.gpu_milli % kStep != 0 || request.gpu_milli <= 0) {
      odd.push_back(request);
    } else {
      by_size[request.gpu_milli / kStep].push_back(request);
    }
  }
  // Taken from the back: the lightest first, a core weighing as much as 4 GiB (about the
  // openb nodes' ratio of memory to CPU).
  const auto weight = [](const Request& request) {
    return request.cpu_milli * 4 + request.memory_mib;
  };
  for (auto& pods : by_size) {
    std::sort(pods.begin(), pods.end(),
              [&](const Request& a, const Request& b) { return weight(a) > weight(b); });
  }
  const int node_count = static_cast<int>(cluster.nodes().size());
  for (int index = 0; index < node_count; ++index) {
    for (int gpu = 0; gpu < cluster.nodes()[index].gpus; ++gpu) {
      const Node& node = cluster.nodes()[index];
      if (!node.takes(gpu, 1)) continue;  // whole-only GPUs take no sharing pod
      const int room = node.gpu_left[gpu] / kStep;
      if (room <= 0) continue;
      // The node's fair share of its CPU and memory for this GPU: what is left over its GPUs
      // with room.
      int with_room = 0;
      for (int i = 0; i < node.gpus; ++i) with_room += node.takes(i, 1);
      const std::int64_t cpu_share = node.cpu_left / std::max(1, with_room);
      const std::int64_t memory_share = node.memory_left / std::max(1, with_room);
      const auto cost_of = [&](const Request& request) {
        return static_cast<double>(request.cpu_milli) /
                   static_cast<double>(std::max<std::int64_t>(1, cpu_share)) +
               static_cast<double>(request.memory_mib) /
                   static_cast<double>(std::max<std::int64_t>(1, memory_share));
      };
      // reach[s]: the size last added to reach s units (0: unreachable; s = 0 is reached),
      // by the way that costs least; cpu[s] and memory[s]: what that way asks.
      std::vector<int> reach(room + 1, 0), used(kUnits + 1, 0);
      std::vector<std::int64_t> cpu(room + 1, 0), memory(room + 1, 0);
      std::vector<double> cost(room + 1, 0);
      reach[0] = -1;
      for (int size = 1; size <= std::min(room, kUnits); ++size) {
        const int available = std::min<int>(static_cast<int>(by_size[size].size()), room / size);
        if (available == 0) continue;
        const Request& lightest = by_size[size].back();
        const double cost_each = cost_of(lightest);
        for (int copy = 0; copy < available; ++copy) {
          bool grew = false;
          for (int s = room; s >= size; --s) {
            if (reach[s - size] == 0) continue;
            const double asked = cost[s - size] + cost_each;
            if (reach[s] == 0 || asked < cost[s]) {
              reach[s] = size;
              cost[s] = asked;
              cpu[s] = cpu[s - size] + lightest.cpu_milli;
              memory[s] = memory[s - size] + lightest.memory_mib;
              grew = true;
            }
          }
          if (!grew) break;
        }
      }
      // The fullest GPU within the shares, else the fullest the node's CPU and memory allow.
      const auto fullest = [&](std::int64_t cpu_limit, std::int64_t memory_limit) {
        int sum = room;
        while (sum > 0 && (reach[sum] == 0 || cpu[sum] > cpu_limit || memory[sum] > memory_limit))
          --sum;
        return sum;
      };
      int best = fullest(cpu_share, memory_share);
      if (best == 0) best = fullest(node.cpu_left, node.memory_left);
      // Takes the sizes that reach `best`, then places one pod of each.
      for (int s = best; s > 0; s -= reach[s]) ++used[reach[s]];
      for (int size = 1; size <= kUnits; ++size) {
        for (int n = 0; n < used[size] && !by_size[size].empty(); ++n) {
          const Request request = by_size[size].back();
          const Node& now = cluster.nodes()[index];
          if (!cluster.fits(now, request) || !now.takes(gpu, request.gpu_milli)) break;
          Placement placement;
          placement.node = index;
          placement.gpu_index[placement.gpu_count++] = gpu;
          cluster.allocate(request, placement);
          by_size[size].pop_back();
          ++placed;
        }
      }
    }
  }
  sharing = std::move(odd);
  for (auto& pods : by_size) sharing.insert(sharing.end(), pods.begin(), pods.end());
}

// One-GPU pods, node by node, the nodes with least CPU per GPU first: each free GPU gets the
// pod asking the most CPU within the node's CPU left per free GPU (the node's fair share),
// so CPU-hungry pods go where CPU is plentiful, and within its fair share of memory too.
// Placed pods are taken out of `whole`.
void fill_whole_gpus(Cluster& cluster, std::vector<Request>& whole, long& placed) {
  std::multimap<std::int64_t, Request> by_cpu;
  std::vector<Request> later;
  for (const Request& request : whole) {
    if (request.gpus == 1 && request.models == 0) {
      by_cpu.emplace(request.cpu_milli, request);
    } else {
      later.push_back(request);
    }
  }
  const std::vector<Node>& nodes = cluster.nodes();
  std::vector<int> order(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) order[i] = static_cast<int>(i);
  auto cpu_per_gpu = [&](int index) {
    const Node& node = nodes[index];
    return node.gpus == 0 ? 1e300 : static_cast<double>(node.cpu_left) / node.gpus;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return cpu_per_gpu(a) < cpu_per_gpu(b); });
  for (const int index : order) {
    for (int gpu = 0; gpu < nodes[index].gpus && !by_cpu.empty(); ++gpu) {
      const Node& node = nodes[index];
      const int free_gpus = node.fully_free_gpus();
      if (node.gpu_left[gpu] != kMilli || free_gpus == 0) continue;
      // The most CPU within the fair share whose memory is within its share too (looking at a
      // bounded number of pods); else the lightest looked at, if it fits at all.
      auto pick = by_cpu.upper_bound(node.cpu_left / free_gpus);
      if (pick == by_cpu.begin()) continue;
      --pick;
      const std::int64_t memory_share = node.memory_left / free_gpus;
      constexpr int kMostLooks = 256;
      for (int looks = 0;
           pick->second.memory_mib > memory_share && pick != by_cpu.begin() && looks < kMostLooks;
           ++looks) {
        --pick;
      }
      if (!cluster.fits(node, pick->second)) continue;
      Placement placement;
      placement.node = index;
      placement.gpu_index[placement.gpu_count++] = gpu;
      cluster.allocate(pick->second, placement);
      by_cpu.erase(pick);
      ++placed;
    }
  }
  for (const auto& [cpu, request] : by_cpu) later.push_back(request);
  whole = std::move(later);
}

// The offline packer: pods of several GPUs by best-fit decreasing, one-GPU pods by the
// nodes' fair share of CPU, the GPUs' room filled by subset sums of the sharing pods, then
// what is left by best-fit decreasing. Returns the milli-GPU allocated.
std::int64_t pack_offline(Cluster& cluster, std::vector<Request> requests, long& placed) {
  std::erase_if(requests, [](const Request& request) { return request.gpus == 0; });
  std::stable_sort(requests.begin(), requests.end(), [](const Request& a, const Request& b) {
    const std::int64_t gpu_a = std::int64_t{a.gpus} * a.gpu_milli;
    const std::int64_t gpu_b = std::int64_t{b.gpus} * b.gpu_milli;
    return gpu_a != gpu_b ? gpu_a > gpu_b : a.cpu_milli > b.cpu_milli;
  });
  std::vector<Request> sharing, whole;
  for (const Request& request : requests) {
    if (request.shares_gpu()) {
      sharing.push_back(request);
    } else if (request.gpus > 1) {
      placed += place_tightest(cluster, request) ? 1 : 0;
    } else {
      whole.push_back(request);
    }
  }
  fill_whole_gpus(cluster, whole, placed);
  fill_gpus(cluster, sharing, placed);
  for (const auto* rest : {&whole, &sharing}) {
    for (const Request& request : *rest) placed += place_tightest(cluster, request) ? 1 : 0;
  }
  return cluster.gpu_milli_allocated();
}

// The most GPU that any schedule of `requests` could allocate (see Reference::bound).
double allocation_bound(const Cluster& cluster, std::vector<Request> requests) {
  std::int64_t cpu = 0;
  for (const Node& node : cluster.nodes()) {
    if (node.gpus > 0) cpu += node.cpu_total;
  }
  std::erase_if(requests, [](const Request& request) { return request.gpus == 0; });
  std::sort(requests.begin(), requests.end(), [](const Request& a, const Request& b) {
    // GPU per CPU, highest first; a pod asking no CPU comes first.
    return static_cast<double>(a.gpus) * a.gpu_milli * static_cast<double>(b.cpu_milli) >
           static_cast<double>(b.gpus) * b.gpu_milli * static_cast<double>(a.cpu_milli);
  });
  double gpu = 0, cpu_left = static_cast<double>(cpu), asked = 0;
  for (const Request& request : requests) {
    const double milli = static_cast<double>(request.gpus) * request.gpu_milli;
    asked += milli;
    if (cpu_left <= 0) continue;
    const double share = request.cpu_milli == 0
                             ? 1.0
                             : std::min(1.0, cpu_left / static_cast<double>(request.cpu_milli));
    gpu += share * milli;
    cpu_left -= share * static_cast<double>(request.cpu_milli);
  }
  return std::min({static_cast<double>(cluster.gpu_milli_total()), asked, gpu});
}

}  // namespace

RunResult run_reference(const std::vector<NodeSpec>& nodes, const std::vector<PodSpec>& trace,
                        Reference reference, std::uint64_t seed, double max_load,
                        Workload workload) {
  require(why_not_a_cluster(nodes));
  require(why_not_inflatable(nodes, trace, max_load));
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 random(seed);
  // The same draws as run_inflation: the node order first, then the arrivals.
  const std::vector<NodeSpec> ordered = in_run_order(nodes, random);
  const Cluster empty(ordered);
  RunResult result{Policy::fgd, reference_name(reference), seed, {}, 0, 0, 0};
  const double capacity = static_cast<double>(empty.gpu_milli_total());
  Arrivals arrivals(trace, workload, random);
  std::vector<Request> requests;
  double arrived = 0;
  // At 100 % arrived (if the run goes that far) and at max_load.
  for (const double load : {1.0, max_load}) {
    if (load > max_load || (!result.curve.empty() && load <= result.curve.back().arrived)) {
      continue;
    }
    while (arrived < load * capacity) {
      const PodSpec& pod = trace[arrivals.next()];
      arrived += static_cast<double>(pod.gpu_milli_total());
      requests.push_back(empty.request_for(pod));
    }
    Cluster cluster = empty;
    long placed = 0;
    const double allocated = reference == Reference::bound
                                 ? allocation_bound(cluster, requests)
                                 : static_cast<double>(pack_offline(cluster, requests, placed));
    result.curve.push_back({load, allocated / capacity, -1});
    result.placed = placed;
    result.pending = static_cast<long>(requests.size()) - placed;
  }
  result.seconds = seconds_since(start);
  return result;
}

std::vector<RunResult> run_all(const std::vector<Job>& jobs, int threads,
                               const std::function<RunResult(const Job&)>& run,
                               const std::function<void(const RunResult&, int done)>& progress) {
  std::vector<RunResult> results(jobs.size());
  std::atomic<std::size_t> next{0};
  base::Mutex report;  // guards done, failure and the progress callback
  int done = 0;
  std::exception_ptr failure;  // the first job's exception: none may escape a thread
  std::vector<std::thread> workers;
  for (int t = 0; t < std::max(1, threads); ++t) {
    workers.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        try {
          results[i] = run(jobs[i]);
          base::MutexLock locked(report);
          progress(results[i], ++done);
        } catch (...) {
          base::MutexLock locked(report);
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
    auto& sum = sums[result.name];
    if (sum.size() < result.curve.size()) sum.resize(result.curve.size());
    for (std::size_t i = 0; i < result.curve.size(); ++i) {
      sum[i].first = result.curve[i].arrived;
      sum[i].second += result.curve[i].allocated;
    }
    ++runs[result.name];
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
