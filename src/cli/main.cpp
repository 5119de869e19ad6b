// The tessera command.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "cli/commands.h"

namespace {

// Never throws: a closed or full stderr must not turn an error into a crash.
void report_error(const std::string& message) {
  const std::string line = "tessera: " + message + "\n";
  std::fputs(line.c_str(), stderr);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera::cli;
  CLI::App app{"Tessera: share NVIDIA GPUs safely between workloads"};
  app.require_subcommand(1);

  RunOptions run;
  CLI::App* run_app =
      app.add_subcommand("run", "Run a command in a sharing group whose device memory is limited");
  run_app->add_option("--memory", run.memory,
                      "Device memory the group may hold, e.g. 8GiB (default: no limit)");
  run_app->add_option("--device", run.device, "Give the group only this GPU (physical index)");
  run_app->add_option("--cores", run.cores,
                      "Percent of the GPU's time the group may use (hard cap)");
  run_app->add_flag("--burst", run.burst,
                    "With --cores: also use GPU time no other group wants, and give it back");
  run_app->add_option("--priority", run.priority,
                      "high: low-priority groups keep out of its way; low: waits while "
                      "high-priority work is pending on its GPU");
  run_app->add_option("--group", run.group,
                      "Join or create a named group (several runs share one limit)");
  run_app->add_flag("--keep", run.keep, "Keep the group's ledger after the command ends");
  run_app->add_flag("--summary", run.summary, "Print limit, peak and refusals at the end");
  run_app->add_option("command", run.command, "The command and its arguments (after --)")
      ->required();

  DevicesOptions devices;
  CLI::App* devices_app = app.add_subcommand("devices", "List GPUs, real or simulated");
  devices_app->add_flag("--json", devices.json, "Print JSON");

  TopOptions top;
  CLI::App* top_app =
      app.add_subcommand("top", "Show each group's memory and compute on each device");
  top_app->add_flag("--once", top.once, "Print one snapshot (after one interval) and exit");
  top_app->add_flag("--json", top.json, "Print JSON (implies --once)");
  top_app
      ->add_option("--interval", top.interval_seconds,
                   "Seconds between refreshes, over which ACHIEVED is measured")
      ->check(CLI::PositiveNumber);

  SimOptions sim;
  CLI::App* sim_app =
      app.add_subcommand("sim", "Replay a cluster trace through the placement engine");
  sim_app->add_option("--nodes", sim.nodes, "Node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
      ->required();
  sim_app
      ->add_option("--pods", sim.pods,
                   "Pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...)")
      ->required();
  sim_app->add_option("--policies", sim.policies, "Comma-separated policies, or all");
  sim_app->add_option("--seeds", sim.seeds, "Seeds: 42, 42-51 or 1,2,3");
  sim_app->add_option("--load", sim.load, "Arrived GPU load to sample up to (1.3 = 130%)");
  sim_app->add_option("--threads", sim.threads, "Runs in parallel")->check(CLI::Range(1, 256));
  sim_app->add_flag("--replay", sim.replay, "Use the trace's own creation and deletion times");
  sim_app->add_option("--workload", sim.workload,
                      "trace-then-sample (the paper's: the whole trace shuffled, then sampled "
                      "pods) or sample (only sampled pods)");
  sim_app->add_option("--output", sim.output, "Directory for curve.csv and allocation.svg");

  SchedulerOptions scheduler;
  CLI::App* scheduler_app = app.add_subcommand("scheduler", "Serve the kube-scheduler extender");
  scheduler_app->add_option("--listen", scheduler.listen, "HOST:PORT to serve on (port 0: any)");
  scheduler_app->add_option("--url-prefix", scheduler.url_prefix,
                            "Path before /filter, /prioritize, /bind");
  scheduler_app->add_option("--api-server", scheduler.api_server,
                            "Kubernetes API server URL (default: in-cluster service account)");
  scheduler_app->add_option("--token-file", scheduler.token_file,
                            "Bearer token for the API server");
  scheduler_app->add_option("--ca-file", scheduler.ca_file, "CA bundle for the API server");
  scheduler_app->add_option("--policy", scheduler.policy, "Default placement policy");
  scheduler_app->add_option("--timeout-ms", scheduler.timeout_ms, "API server timeout per attempt")
      ->check(CLI::Range(1, 600000));

  // CLI11 would only say "a subcommand is required"; name the word it did not know.
  const auto known = [&app](const std::string& name) {
    for (const CLI::App* command : app.get_subcommands({})) {
      if (command->get_name() == name) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !known(argv[1])) {
    report_error(fmt::format(
        "unknown command '{}' (commands: run, devices, top, sim, scheduler; see --help)", argv[1]));
    return kUsageStatus;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version are "errors" that succeed; everything else is a refused argument.
    const int status = app.exit(error);
    return status == 0 ? 0 : kUsageStatus;
  }
  try {
    if (run_app->parsed()) return run_command(run);
    if (devices_app->parsed()) return devices_command(devices);
    if (sim_app->parsed()) return sim_command(sim);
    if (scheduler_app->parsed()) return scheduler_command(scheduler);
    if (top_app->parsed()) {
      top.once = top.once || top.json;
      return top_command(top);
    }
  } catch (const UsageError& error) {
    report_error(error.what());
    return kUsageStatus;
  } catch (const std::exception& error) {
    report_error(error.what());
    return 1;
  }
  return kUsageStatus;
}
