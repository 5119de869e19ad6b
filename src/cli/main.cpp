// The tessera command.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
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
  run_app->add_option("--priority-tolerance", run.tolerance,
                      "With --priority high: percent of its kernels' time it lets low-priority "
                      "work delay it (1 to 100, default 10)");
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
  sim_app->add_flag("--preemption", sim.preemption,
                    "A pod that fits nowhere evicts pods of lower priority (from the trace's qos: "
                    "LS and Guaranteed 1000, Burstable 500, BE 0)");
  sim_app->add_flag("!--no-references", sim.references,
                    "Leave out the offline packer and the bound shown beside the policies");
  sim_app->add_option("--mig-nodes", sim.mig_nodes,
                      "Share of the nodes with --mig-node-gpus GPUs whose last --mig-gpus GPUs are "
                      "MIG-capable (0: none)");
  sim_app->add_option("--mig-node-gpus", sim.mig_node_gpus, "GPUs of the nodes --mig-nodes picks");
  sim_app->add_option("--mig-gpus", sim.mig_gpus, "MIG-capable GPUs on each picked node");
  sim_app->add_option("--mig-model", sim.mig_model,
                      "The MIG-capable GPUs' model, for its profiles (A100-40GB, H100-80GB, ...)");
  sim_app->add_option("--mig-layout", sim.mig_layout,
                      "Each MIG-capable GPU's layout at start, as profile=count,... or whole");
  sim_app->add_option("--mig-pods", sim.mig_pods,
                      "Share of the pods sharing one GPU, at most half of it, that ask for the "
                      "smallest MIG profile holding them instead");
  sim_app->add_flag("--dynamic-mig", sim.dynamic_mig,
                    "Re-cut MIG GPUs (and turn MIG on or off on idle ones) for pods that fit "
                    "nowhere");
  sim_app->add_option("--recut-seconds", sim.recut_seconds,
                      "Price of a re-cut: seconds its new GPU instances are unavailable");
  sim_app->add_option("--mig-mode-seconds", sim.mig_mode_seconds,
                      "Price of a MIG mode change: seconds its whole GPU is unavailable");

  TraceGenOptions trace_gen;
  CLI::App* trace_gen_app = app.add_subcommand(
      "gen-trace", "Write a trace of the same pods in another shape, for tuning policies");
  trace_gen_app
      ->add_option("--nodes", trace_gen.nodes,
                   "Node list CSV: the models and CPU a generated pod must fit")
      ->required();
  trace_gen_app->add_option("--from", trace_gen.from, "Pod list CSV to draw pods from")->required();
  trace_gen_app->add_option("--output", trace_gen.output, "Pod list CSV to write")->required();
  trace_gen_app->add_option("--sharing", trace_gen.shape.sharing,
                            "Share of the GPU asked by GPU-sharing pods (0-1; default: as --from)");
  trace_gen_app->add_option("--multi-gpu", trace_gen.shape.multi_gpu,
                            "Share of the GPU asked by pods of several GPUs (0-1)");
  trace_gen_app->add_option("--gpu-spec", trace_gen.shape.gpu_spec,
                            "Share of GPU pods restricted to one GPU model (0-1)");
  trace_gen_app
      ->add_option("--gpu-spec-choice", trace_gen.shape.model_choice,
                   "How a restricted pod's model is chosen: gpus (weighed by the models' GPUs) "
                   "or uniform")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, tessera::sched::TraceShape::ModelChoice>{
              {"gpus", tessera::sched::TraceShape::ModelChoice::by_gpus},
              {"uniform", tessera::sched::TraceShape::ModelChoice::uniform}},
          CLI::ignore_case));
  trace_gen_app->add_option("--gpu-pod-cpu", trace_gen.shape.gpu_pod_cpu,
                            "Factor on each GPU pod's CPU");
  trace_gen_app->add_option("--cpu-only", trace_gen.shape.cpu_only,
                            "Factor on the number of CPU-only pods");
  trace_gen_app->add_option("--seed", trace_gen.seed, "Seed of the draw");

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
  scheduler_app->add_option("--tls-cert-file", scheduler.tls_cert_file,
                            "Serve HTTPS with this PEM certificate (chain) ...");
  scheduler_app->add_option("--tls-key-file", scheduler.tls_key_file,
                            "... and this PEM private key");
  scheduler_app->add_flag("--leader-elect", scheduler.leader_elect,
                          "Bind only while this replica holds the Lease (several replicas)");
  scheduler_app->add_flag("--lease-follow", scheduler.lease_follow,
                          "Never take the Lease: lead while its holder is this replica's "
                          "identity (a kube-scheduler beside it holds it)");
  scheduler_app->add_option("--lease-name", scheduler.lease_name, "The Lease's name");
  scheduler_app->add_option("--lease-namespace", scheduler.lease_namespace,
                            "The Lease's namespace (default: POD_NAMESPACE, else kube-system)");
  scheduler_app->add_option("--leader-identity", scheduler.leader_identity,
                            "This replica's name in the Lease (default: POD_NAME, else the "
                            "host name)");
  scheduler_app
      ->add_option("--lease-duration", scheduler.lease_duration_s,
                   "Seconds a Lease not renewed stays held")
      ->check(CLI::Range(1, 3600));
  scheduler_app
      ->add_option("--renew-deadline", scheduler.renew_deadline_s,
                   "Seconds the leader may fail to renew before it stops binding")
      ->check(CLI::Range(0.01, 3600.0));
  scheduler_app
      ->add_option("--retry-period", scheduler.retry_period_s,
                   "Seconds between tries to take or renew the Lease")
      ->check(CLI::Range(0.01, 3600.0));

  NodeOptions node;
  CLI::App* node_app = app.add_subcommand(
      "node", "Serve the kubelet's device plugins for this node's GPUs (the node agent)");
  node_app->add_option("--node-name", node.node_name,
                       "This node's name (default: NODE_NAME, else the host name)");
  node_app->add_option("--device-plugin-dir", node.device_plugin_dir,
                       "The kubelet's device plugin directory");
  node_app->add_option("--config-file", node.config_file, "One NVIDIA device-plugin config (v1)");
  node_app->add_option("--config-dir", node.config_dir,
                       "Named configs, a file each (a mounted ConfigMap); the node label "
                       "nvidia.com/device-plugin.config chooses one");
  node_app->add_option("--config", node.config, "The config to use when no node label names one");
  node_app->add_option("--features-dir", node.features_dir,
                       "Write the GPU labels for node-feature-discovery here (e.g. "
                       "/etc/kubernetes/node-feature-discovery/features.d)");
  node_app->add_option("--state-dir", node.state_dir,
                       "Host directory for the hook, the containers' ledgers and the devices' "
                       "coordination files");
  node_app->add_option("--pod-resources-socket", node.pod_resources_socket,
                       "The kubelet's pod-resources API: whose devices a container's are");
  node_app->add_flag("--dra", node.dra,
                     "Hand out the GPUs through Dynamic Resource Allocation (driver "
                     "gpu.tessera.io) instead of device plugins; needs the API server");
  node_app->add_option("--plugins-registry-dir", node.plugins_registry_dir,
                       "--dra: the kubelet's plugin registry directory");
  node_app->add_option("--plugins-dir", node.plugins_dir,
                       "--dra: the kubelet's plugins directory (the DRA socket goes in "
                       "<dir>/gpu.tessera.io/)");
  node_app->add_option("--cdi-dir", node.cdi_dir,
                       "--dra: where prepared claims' CDI specs are written");
  node_app->add_option("--metrics-listen", node.metrics_listen,
                       "HOST:PORT for /metrics (default: none)");
  node_app->add_option("--api-server", node.api_server,
                       "Kubernetes API server URL (default: in-cluster in a pod, else none)");
  node_app->add_option("--token-file", node.token_file, "Bearer token for the API server");
  node_app->add_option("--ca-file", node.ca_file, "CA bundle for the API server");
  node_app->add_option(
      "--recovery-period", node.recovery_seconds,
      "Seconds without errors after which a failed GPU is healthy again (0: never)");
  node_app->add_option("--replica-policy", node.replica_policy,
                       "Replicas of several GPUs: distributed (fewest in use first) or packed");
  node_app->add_option("--mps-control", node.mps_control,
                       "The nvidia-cuda-mps-control to run for sharing.mps (default: on PATH)");
  node_app->add_option("--nvidia-smi", node.nvidia_smi,
                       "The nvidia-smi to run for flags.computeTimeslice (default: on PATH)");

  SimGpuEventOptions simgpu_event;
  CLI::App* simgpu_app = app.add_subcommand("simgpu", "Act on the simulated GPU");
  simgpu_app->require_subcommand(1);
  CLI::App* simgpu_event_app = simgpu_app->add_subcommand(
      "event", "Raise an XID or ECC error on a simulated GPU, as a failing GPU would");
  simgpu_event_app->add_option("--device", simgpu_event.device, "The GPU (index)")->required();
  simgpu_event_app->add_option("--xid", simgpu_event.xid, "An XID critical error, e.g. 79");
  simgpu_event_app->add_option("--ecc", simgpu_event.ecc, "An ECC error: single or double (bit)");

  int simgpu_reset_device = -1;
  CLI::App* simgpu_reset_app = simgpu_app->add_subcommand(
      "reset", "Reset a simulated GPU, as nvidia-smi -r: applies a pending MIG mode");
  simgpu_reset_app->add_option("--device", simgpu_reset_device, "The GPU (index)")->required();

  MigOptions mig;
  CLI::App* mig_app = app.add_subcommand(
      "mig", "Plan, apply and show MIG layouts (mig-parted's config files), and advise on one");
  mig_app->require_subcommand(1);
  for (const auto& [action, help] :
       {std::pair<const char*, const char*>{"show",
                                            "Each GPU's MIG layout, as a picture of its slots"},
        {"plan", "What apply would do, or with --model where each config's instances go"},
        {"apply", "Lay the GPUs out as the config says: fewest changes, rolled back on failure"},
        {"advise", "The layout that runs the most of a workload mix"}}) {
    CLI::App* command = mig_app->add_subcommand(action, help);
    command->callback([&mig, action = std::string(action)] { mig.action = action; });
    if (std::string(action) == "plan" || std::string(action) == "apply") {
      command->add_option("-f,--config-file", mig.config_file,
                          "mig-parted's config file (version v1)");
      command->add_option("-c,--config", mig.config, "Which of its configs");
      command->add_option("-d,--device", mig.devices, "Only these GPUs (index; repeatable)");
      command->add_flag("--force", mig.force,
                        "Destroy GPU instances even while processes use them");
    }
    if (std::string(action) == "plan" || std::string(action) == "advise") {
      command->add_option("--model", mig.model,
                          "A GPU model (A100-40GB, A100-80GB, H100-80GB, H100-NVL, H200, A30)");
    }
    if (std::string(action) == "advise") {
      command->add_option("--job", mig.jobs,
                          "COUNTxMEMORY[@COMPUTE_SLICES], e.g. 3x9GiB (repeatable)");
      command->add_option("--pods", mig.pods,
                          "A pod list (kubectl get pods -o json): MIG profiles, or HAMi's "
                          "gpumem and gpucores, or whole GPUs");
      command->add_option("--gpus", mig.gpus, "How many GPUs")->check(CLI::Range(1, 64));
    }
  }

  // CLI11 would only say "a subcommand is required"; name the word it did not know.
  const auto known = [&app](const std::string& name) {
    for (const CLI::App* command : app.get_subcommands({})) {
      if (command->get_name() == name) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !known(argv[1])) {
    report_error(fmt::format(
        "unknown command '{}' (commands: run, devices, top, sim, scheduler, node, simgpu, mig; see "
        "--help)",
        argv[1]));
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
    if (trace_gen_app->parsed()) return trace_gen_command(trace_gen);
    if (scheduler_app->parsed()) return scheduler_command(scheduler);
    if (node_app->parsed()) return node_command(node);
    if (simgpu_event_app->parsed()) return simgpu_event_command(simgpu_event);
    if (simgpu_reset_app->parsed()) return simgpu_reset_command(simgpu_reset_device);
    if (mig_app->parsed()) return mig_command(mig);
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
