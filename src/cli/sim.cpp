// tessera sim: replay a cluster trace through the placement engine.
#include <fmt/core.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "cli/commands.h"
#include "mig/catalog.h"
#include "sched/experiment.h"
#include "sched/trace_generator.h"

namespace tessera::cli {
namespace {

// A whole decimal number that fits, nothing before or after it.
bool parse_seed(std::string_view text, std::uint64_t& seed) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seed);
  return !text.empty() && error == std::errc() && end == text.data() + text.size();
}

// The items of a comma-separated list, empty ones kept (for the caller to refuse).
std::vector<std::string_view> comma_items(std::string_view text) {
  std::vector<std::string_view> items;
  for (std::size_t comma; (comma = text.find(',')) != std::string_view::npos;) {
    items.push_back(text.substr(0, comma));
    text.remove_prefix(comma + 1);
  }
  items.push_back(text);
  return items;
}

std::vector<std::uint64_t> parse_seeds(const std::string& text) {
  constexpr std::uint64_t kMostSeeds = 10000;
  std::vector<std::uint64_t> seeds;
  for (const std::string_view item : comma_items(text)) {
    const std::size_t dash = item.find('-');
    std::uint64_t first = 0, last = 0;
    const bool valid = dash == std::string_view::npos
                           ? parse_seed(item, first) && (last = first, true)
                           : parse_seed(item.substr(0, dash), first) &&
                                 parse_seed(item.substr(dash + 1), last) && first <= last;
    if (!valid || last - first >= kMostSeeds || seeds.size() + (last - first) >= kMostSeeds) {
      throw UsageError(fmt::format(
          "--seeds '{}': '{}' is not a seed or a rising range like 42-51 (at most {} seeds)", text,
          item, kMostSeeds));
    }
    for (std::uint64_t seed = first;; ++seed) {
      seeds.push_back(seed);
      if (seed == last) break;
    }
  }
  return seeds;
}

std::vector<sched::Policy> parse_policies(const std::string& text) {
  if (text == "all") return sched::all_policies();
  std::vector<sched::Policy> policies;
  for (const std::string_view item : comma_items(text)) {
    try {
      policies.push_back(sched::parse_policy(std::string(item)));
    } catch (const std::invalid_argument& error) {
      throw UsageError(fmt::format("--policies: {}", error.what()));
    }
  }
  return policies;
}

// "3g.20gb=1,1g.5gb=2" against the model's profiles; "whole" is none (MIG off).
mig::ProfileCounts parse_layout(const std::string& text, const mig::GpuModel& model) {
  mig::ProfileCounts counts;
  if (text == "whole") return counts;
  for (const std::string_view item : comma_items(text)) {
    const std::size_t equals = item.find('=');
    const std::string name(item.substr(0, equals));
    int count = 0;
    const std::string_view number =
        equals == std::string_view::npos ? std::string_view() : item.substr(equals + 1);
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), count);
    const mig::Profile* profile = model.profile_named(name);
    if (profile == nullptr || error != std::errc() || end != number.data() + number.size() ||
        count < 1 || count > 7) {
      throw UsageError(fmt::format(
          "--mig-layout '{}': '{}' is not profile=count with a {} profile and a count of 1 to 7",
          text, item, model.key));
    }
    counts[name] += count;
  }
  return counts;
}

// The MIG options, checked; null when the cluster has no MIG-capable GPU.
std::optional<sched::DynamicMigOptions> mig_options(const SimOptions& options,
                                                    std::vector<sched::NodeSpec>& nodes) {
  const bool any = options.mig_nodes != 0 || options.mig_pods != 0 || options.dynamic_mig;
  if (!any) return std::nullopt;
  const auto share = [](const char* name, double value) {
    if (!(value >= 0 && value <= 1))
      throw UsageError(fmt::format("{} {} must be from 0 to 1", name, value));
  };
  share("--mig-nodes", options.mig_nodes);
  share("--mig-pods", options.mig_pods);
  if (options.mig_gpus < 1 || options.mig_gpus > options.mig_node_gpus ||
      options.mig_node_gpus > sched::kMostGpusPerNode) {
    throw UsageError(fmt::format("--mig-gpus {} must be from 1 to --mig-node-gpus {} (at most {})",
                                 options.mig_gpus, options.mig_node_gpus, sched::kMostGpusPerNode));
  }
  for (const auto& [name, value] : {std::pair{"--recut-seconds", options.recut_seconds},
                                    std::pair{"--mig-mode-seconds", options.mig_mode_seconds}}) {
    if (!(value >= 0 && value <= 86400))
      throw UsageError(fmt::format("{} {} must be from 0 to 86400", name, value));
  }
  const mig::GpuModel* model = mig::find_model(options.mig_model);
  if (model == nullptr) {
    std::string known;
    for (const mig::GpuModel& each : mig::builtin_catalog())
      known += (known.empty() ? "" : ", ") + each.key;
    throw UsageError(fmt::format("--mig-model '{}' is not a MIG-capable model (known: {})",
                                 options.mig_model, known));
  }
  sched::DynamicMigOptions mig{model,
                               parse_layout(options.mig_layout, *model),
                               options.dynamic_mig,
                               {options.recut_seconds, options.mig_mode_seconds}};
  // Spread evenly: the j-th candidate is picked when the share's running count steps up.
  long candidates = 0;
  for (sched::NodeSpec& node : nodes) {
    if (node.gpus != options.mig_node_gpus) continue;
    const auto before = static_cast<long>(static_cast<double>(candidates) * options.mig_nodes);
    const auto after = static_cast<long>(static_cast<double>(candidates + 1) * options.mig_nodes);
    if (after > before) node.mig_capable_gpus = options.mig_gpus;
    ++candidates;
  }
  return mig;
}

}  // namespace

int sim_command(const SimOptions& options) {
  const std::vector<std::uint64_t> seeds = parse_seeds(options.seeds);
  std::vector<sched::NodeSpec> nodes = sched::read_nodes(options.nodes);
  const std::optional<sched::DynamicMigOptions> mig = mig_options(options, nodes);
  if (mig && (options.replay || options.preemption)) {
    throw UsageError("the --mig options apply to sampled arrivals without --preemption");
  }
  const std::vector<sched::PodSpec> pods = sched::read_pods(options.pods);
  // Refused here, with the file named, rather than by a run on another thread.
  if (const std::string why = sched::why_not_a_cluster(nodes); !why.empty()) {
    throw std::runtime_error(fmt::format("{}: {}", options.nodes, why));
  }
  const std::string unfit = options.replay ? sched::why_not_replayable(pods)
                                           : sched::why_not_inflatable(nodes, pods, options.load);
  if (!unfit.empty()) throw std::runtime_error(fmt::format("{}: {}", options.pods, unfit));
  std::vector<sched::Job> jobs;
  for (sched::Policy policy : parse_policies(options.policies)) {
    for (std::uint64_t seed : seeds) jobs.push_back({policy, seed});
  }
  // Beside the policies, how far they are from what is possible on the same pods.
  if (!options.replay && options.references && !mig) {  // the references know no MIG
    for (const sched::Reference reference :
         {sched::Reference::offline_packer, sched::Reference::bound}) {
      for (std::uint64_t seed : seeds) jobs.push_back({sched::Policy::fgd, seed, reference});
    }
  }
  if (options.workload != "trace-then-sample" && options.workload != "sample") {
    throw UsageError(
        fmt::format("--workload '{}' must be trace-then-sample or sample", options.workload));
  }
  const sched::Workload workload =
      options.workload == "sample" ? sched::Workload::sample : sched::Workload::trace_then_sample;
  if (options.preemption && options.replay) {
    throw UsageError("--preemption applies to sampled arrivals, not to --replay");
  }
  if (!(options.load > 0 && options.load <= 10)) {
    throw UsageError(fmt::format("--load {} must be above 0 and at most 10", options.load));
  }
  fmt::print(stderr, "tessera sim: {} nodes, {} pods in the trace, {} runs on {} threads\n",
             nodes.size(), pods.size(), jobs.size(), options.threads);
  const auto results = sched::run_all(
      jobs, options.threads,
      [&](const sched::Job& job) {
        if (job.reference) {
          return sched::run_reference(nodes, pods, *job.reference, job.seed, options.load,
                                      workload);
        }
        if (mig) {  // the run's own pods asking for profiles, drawn by its seed
          return sched::run_inflation(
              nodes, sched::with_mig_pods(pods, *mig->model, options.mig_pods, job.seed),
              job.policy, job.seed, options.load, workload, false, &*mig);
        }
        return options.replay ? sched::run_replay(nodes, pods, job.policy, job.seed)
                              : sched::run_inflation(nodes, pods, job.policy, job.seed,
                                                     options.load, workload, options.preemption);
      },
      [&](const sched::RunResult& result, int done) {
        fmt::print(stderr, "[{}/{}] {} seed {}: {} placed, {} pending, {:.1f} s\n", done,
                   jobs.size(), result.name, result.seed, result.placed, result.pending,
                   result.seconds);
      });

  if (!options.output.empty()) {
    std::filesystem::create_directories(options.output);
    std::ofstream curve(options.output + "/curve.csv");
    curve << "policy,seed,arrived_pct,allocated_pct,fragmented_pct\n";
    for (const auto& result : results) {
      for (const auto& point : result.curve) {
        curve << fmt::format(
            "{},{},{:.2f},{:.3f},{}\n", result.name, result.seed, 100 * point.arrived,
            100 * point.allocated,
            point.fragmented < 0 ? std::string() : fmt::format("{:.3f}", 100 * point.fragmented));
      }
    }
    std::ofstream(options.output + "/allocation.svg") << sched::plot_svg(results);
  }
  if (options.replay) {
    fmt::print("{:<16}{:>12}{:>12}\n", "POLICY", "PLACED", "PENDING");
    for (const auto& result : results) {
      fmt::print("{:<16}{:>12}{:>12}\n", result.name, result.placed, result.pending);
    }
    return 0;
  }
  // Mean and spread over seeds at 100 % and at the full arrived load.
  struct Summary {
    std::vector<double> at100, at_max;
    double preemptions = 0, victims = 0, arrivals = 0;  // summed over seeds
    double recuts = 0, mode_changes = 0, unavailable = 0;
  };
  std::map<std::string, Summary> summary;
  std::vector<std::string> order;
  for (const auto& result : results) {
    const std::string name = result.name;
    if (!summary.count(name)) order.push_back(name);
    summary[name].at100.push_back(100 * result.allocated_at(1.0));
    summary[name].at_max.push_back(100 * result.allocated_at(options.load));
    summary[name].preemptions += static_cast<double>(result.preemptions);
    summary[name].victims += static_cast<double>(result.victims);
    summary[name].arrivals += static_cast<double>(result.placed + result.pending);
    summary[name].recuts += static_cast<double>(result.mig_recuts);
    summary[name].mode_changes += static_cast<double>(result.mig_mode_changes);
    summary[name].unavailable += result.mig_unavailable_gpu_seconds;
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  auto deviation = [&](const std::vector<double>& v) {
    const double m = mean(v);
    double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return v.size() > 1 ? std::sqrt(s / static_cast<double>(v.size() - 1)) : 0.0;
  };
  fmt::print("GPU allocation ratio (%), mean ± sd over {} seed(s)\n", seeds.size());
  fmt::print("{:<16}{:>18}{:>18}\n", "POLICY", "AT 100% ARRIVED",
             fmt::format("AT {:.0f}% ARRIVED", 100 * options.load));
  for (const std::string& name : order) {
    const Summary& s = summary[name];
    fmt::print("{:<16}{:>12.2f} ± {:<4.2f}{:>12.2f} ± {:<4.2f}\n", name, mean(s.at100),
               deviation(s.at100), mean(s.at_max), deviation(s.at_max));
  }
  if (mig && mig->dynamic) {
    fmt::print("\nDynamic MIG, mean per run and per 1,000 arrived pods\n");
    fmt::print("{:<16}{:>10}{:>14}{:>12}{:>12}{:>14}\n", "POLICY", "RE-CUTS", "MODE-CHANGES",
               "RE-CUTS/1K", "MODES/1K", "GPU-SECONDS");
    for (const std::string& name : order) {
      const Summary& s = summary[name];
      const double runs = static_cast<double>(s.at100.size());
      fmt::print("{:<16}{:>10.1f}{:>14.1f}{:>12.2f}{:>12.2f}{:>14.0f}\n", name, s.recuts / runs,
                 s.mode_changes / runs, 1000 * s.recuts / s.arrivals,
                 1000 * s.mode_changes / s.arrivals, s.unavailable / runs);
    }
  }
  if (options.preemption) {
    fmt::print("\nPreemption, mean per run and per 1,000 arrived pods\n");
    fmt::print("{:<16}{:>14}{:>12}{:>16}{:>12}\n", "POLICY", "PREEMPTIONS", "VICTIMS",
               "PREEMPTIONS/1K", "VICTIMS/1K");
    for (const std::string& name : order) {
      const Summary& s = summary[name];
      if (name == sched::reference_name(sched::Reference::offline_packer) ||
          name == sched::reference_name(sched::Reference::bound)) {
        continue;  // the references do not preempt
      }
      const double runs = static_cast<double>(s.at100.size());
      fmt::print("{:<16}{:>14.1f}{:>12.1f}{:>16.2f}{:>12.2f}\n", name, s.preemptions / runs,
                 s.victims / runs, 1000 * s.preemptions / s.arrivals,
                 1000 * s.victims / s.arrivals);
    }
  }
  return 0;
}

int trace_gen_command(const TraceGenOptions& options) {
  const std::vector<sched::NodeSpec> nodes = sched::read_nodes(options.nodes);
  const std::vector<sched::PodSpec> source = sched::read_pods(options.from);
  if (const std::string why = sched::why_not_generable(source, options.shape); !why.empty()) {
    throw UsageError(fmt::format("{}: {}", options.from, why));
  }
  const auto pods = sched::generate_trace(source, nodes, options.shape, options.seed);
  sched::write_pods(options.output, pods);
  fmt::print(stderr, "tessera gen-trace: {} pods written to {}\n", pods.size(), options.output);
  return 0;
}

}  // namespace tessera::cli
