// tessera node: the node agent (src/node), with its metrics over HTTP; and tessera simgpu
// event, which raises a device event on the simulated GPU as a failing GPU would.
#include <dlfcn.h>
#include <fmt/core.h>
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/files.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/environment.h"
#include "cuda_abi/nvml_abi.h"
#include "dra/node_plugin.h"
#include "kube/api_cluster.h"
#include "kube/objects.h"
#include "node/agent.h"

namespace tessera::cli {
namespace {

const base::ProgramLog& node_log() {
  static const base::ProgramLog log("node");
  return log;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// A node hands out its GPUs one way: two allocators of one GPU could not see each other's
// grants. The manifests fence the two DaemonSets apart by a node label; this refuses a second
// agent that starts beside one serving the other way anyway.
void refuse_the_other_mode(const NodeOptions& options) {
  namespace fs = std::filesystem;
  if (options.dra) {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(options.device_plugin_dir, error)) {
      const std::string name = entry.path().filename().string();
      if (node::is_device_plugin_socket_name(name) && base::socket_answers(entry.path().string())) {
        throw std::runtime_error(fmt::format(
            "a Tessera device plugin serves this node's GPUs ({}); a node hands out its GPUs one "
            "way: stop it (deploy/tessera-node.yaml keeps off nodes labelled "
            "tessera.io/gpu-allocation=dra) before starting --dra",
            entry.path().string()));
      }
    }
    return;
  }
  const std::string registration =
      contract::dra_registration_socket(options.plugins_registry_dir, contract::kDraDriverName);
  if (base::socket_answers(registration)) {
    throw std::runtime_error(fmt::format(
        "Tessera's DRA driver serves this node's GPUs ({}); a node hands out its GPUs one way: "
        "stop it, or run this agent with --dra",
        registration));
  }
}

}  // namespace

int node_command(const NodeOptions& options) {
  node::NodeAgentOptions agent;
  agent.node_name = options.node_name;
  if (agent.node_name.empty()) {
    const char* from_pod = std::getenv("NODE_NAME");
    agent.node_name = from_pod != nullptr && *from_pod != '\0' ? from_pod : host_name();
  }
  // It goes into the API server's paths: Kubernetes' rule for node names, nothing else.
  if (!kube::dns_name(agent.node_name, kube::kMostNameLength, true)) {
    throw UsageError(fmt::format(
        "node name '{}' is not a Kubernetes node name (lowercase letters, digits, '-' and '.'); "
        "set --node-name or NODE_NAME",
        agent.node_name.substr(0, 300)));
  }
  if (options.recovery_seconds < 0 || options.recovery_seconds > 86400) {
    throw UsageError(fmt::format("--recovery-period {} must be from 0 (never) to 86400 seconds",
                                 options.recovery_seconds));
  }
  agent.recovery_quiet =
      std::chrono::milliseconds(static_cast<long long>(options.recovery_seconds * 1000));
  if (options.replica_policy == "distributed") {
    agent.replica_policy = node::ReplicaPolicy::distributed;
  } else if (options.replica_policy == "packed") {
    agent.replica_policy = node::ReplicaPolicy::packed;
  } else {
    throw UsageError(
        fmt::format("--replica-policy '{}' must be distributed or packed", options.replica_policy));
  }
  if (!options.config_file.empty() && !options.config_dir.empty()) {
    throw UsageError("--config-file and --config-dir are two ways to give the configs: use one");
  }
  std::string metrics_host;
  int metrics_port = -1;
  if (!options.metrics_listen.empty()) {
    split_listen_address(options.metrics_listen, "--metrics-listen", metrics_host, metrics_port);
  }
  agent.device_plugin_dir = options.device_plugin_dir;
  agent.config_file = options.config_file;
  agent.config_dir = options.config_dir;
  agent.config_name = options.config;
  agent.features_dir = options.features_dir;
  agent.state_dir = options.state_dir;
  agent.pod_resources_socket = options.pod_resources_socket;
  agent.report = node_log().reporter();

  const Installation installation = locate_installation();
  agent.hook_library = installation.hook_library;
  if (use_simulated_gpu(installation)) {
    node_log().info("no NVIDIA driver found; using the simulated GPU");
    agent.nvml_library = installation.simulator_dir + "/libnvidia-ml.so.1";
    agent.mps_control = installation.simulator_dir + "/nvidia-cuda-mps-control";
    agent.nvidia_smi = installation.simulator_dir + "/nvidia-smi";
  }
  if (!options.mps_control.empty()) agent.mps_control = options.mps_control;
  if (!options.nvidia_smi.empty()) agent.nvidia_smi = options.nvidia_smi;
  std::unique_ptr<kube::ApiCluster> dra_cluster;  // the DRA plugin's own client
  if (!options.api_server.empty() || kube::in_cluster()) {
    kube::ApiClientOptions api;
    const base::Status configured = kube::client_options({.server = options.api_server,
                                                          .token_file = options.token_file,
                                                          .ca_file = options.ca_file,
                                                          .timeout_ms = 5000},
                                                         api);
    if (!configured.ok()) throw std::runtime_error(configured.message());
    agent.cluster = std::make_unique<kube::ApiCluster>(api);
    if (options.dra) dra_cluster = std::make_unique<kube::ApiCluster>(api);
  }
  if (options.dra && dra_cluster == nullptr) {
    throw UsageError(
        "--dra reads claims and publishes ResourceSlices: give --api-server, or run "
        "in a pod");
  }
  agent.serve_device_plugins = !options.dra;
  refuse_the_other_mode(options);

  std::signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;  // taken by one thread; blocked before any thread starts
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const std::string node_name = agent.node_name, state_dir = agent.state_dir;
  node::NodeAgent node_agent(std::move(agent));
  node_agent.start();
  std::unique_ptr<dra::DraNodePlugin> dra_plugin;
  if (options.dra) {
    dra_plugin = std::make_unique<dra::DraNodePlugin>(
        dra::DraPluginOptions{.registry_dir = options.plugins_registry_dir,
                              .plugins_dir = options.plugins_dir,
                              .cdi_dir = options.cdi_dir,
                              .node_name = node_name,
                              .state_dir = state_dir},
        node_agent, *dra_cluster, node_log().reporter());
    dra_plugin->start();
  }

  httplib::Server metrics;
  std::thread serving;
  std::atomic<bool> served{false};
  if (metrics_port >= 0) {
    metrics.new_task_queue = [] { return new httplib::ThreadPool(4); };
    metrics.set_read_timeout(5, 0);
    metrics.set_write_timeout(5, 0);
    metrics.Get("/metrics", [&node_agent, &dra_plugin](const httplib::Request&,
                                                       httplib::Response& response) {
      response.set_content(node_agent.metrics() + (dra_plugin ? dra_plugin->metrics() : ""),
                           "text/plain; version=0.0.4");
    });
    metrics.Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
      response.set_content("ok", "text/plain");
    });
    const int bound = metrics_port == 0
                          ? metrics.bind_to_any_port(metrics_host)
                          : (metrics.bind_to_port(metrics_host, metrics_port) ? metrics_port : -1);
    if (bound < 0)
      throw std::runtime_error(fmt::format("cannot listen on {}", options.metrics_listen));
    node_log().info(fmt::format("metrics on http://{}:{}/metrics", metrics_host, bound));
    serving = std::thread([&metrics, &served] {
      metrics.listen_after_bind();
      served = true;
    });
  }
  std::fputs("tessera node: serving\n", stdout);
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stop_signals, &signal);
  node_log().info(fmt::format("stopping ({})", strsignal(signal)));
  if (serving.joinable()) {
    // A stop that comes before the server runs is lost on it (cpp-httplib): asked until it ends.
    while (!served) {
      metrics.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    serving.join();
  }
  if (dra_plugin != nullptr) dra_plugin->stop();
  node_agent.stop();
  return 0;
}

int simgpu_event_command(const SimGpuEventOptions& options) {
  using namespace tessera::abi;
  if (options.xid.has_value() == !options.ecc.empty()) {
    throw UsageError("say which event: --xid N, or --ecc single|double");
  }
  if (!options.ecc.empty() && options.ecc != "single" && options.ecc != "double") {
    throw UsageError(fmt::format("--ecc '{}' must be single or double", options.ecc));
  }
  const Installation installation = locate_installation();
  if (installation.simulator_dir.empty())
    throw std::runtime_error("the simulated GPU is not installed");
  const std::string library = installation.simulator_dir + "/libnvidia-ml.so.1";
  void* nvml = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (nvml == nullptr)
    throw std::runtime_error(fmt::format("cannot load {}: {}", library, dlerror()));
  auto init = reinterpret_cast<PFN_nvmlInit_v2>(dlsym(nvml, "nvmlInit_v2"));
  auto count = reinterpret_cast<PFN_nvmlDeviceGetCount_v2>(dlsym(nvml, "nvmlDeviceGetCount_v2"));
  using RaiseEvent = nvmlReturn_t (*)(unsigned, unsigned long long, unsigned long long);
  auto raise = reinterpret_cast<RaiseEvent>(dlsym(nvml, "tesseraSimRaiseEvent"));
  if (init == nullptr || count == nullptr || raise == nullptr) {
    throw std::runtime_error(fmt::format("{} is not Tessera's simulated NVML", library));
  }
  if (init() != NVML_SUCCESS)
    throw std::runtime_error("the simulated GPU cannot be attached (see above)");
  unsigned devices = 0;
  count(&devices);
  if (options.device < 0 || static_cast<unsigned>(options.device) >= devices) {
    throw UsageError(
        fmt::format("--device {}: the simulated machine has {} GPU(s)", options.device, devices));
  }
  const unsigned long long type = options.xid               ? nvmlEventTypeXidCriticalError
                                  : options.ecc == "double" ? nvmlEventTypeDoubleBitEccError
                                                            : nvmlEventTypeSingleBitEccError;
  if (raise(static_cast<unsigned>(options.device), type, options.xid.value_or(0)) != NVML_SUCCESS) {
    throw std::runtime_error("the simulated GPU refused the event");
  }
  fmt::print("raised {} on simulated GPU {}\n",
             options.xid ? fmt::format("XID {}", *options.xid) : options.ecc + "-bit ECC error",
             options.device);
  return 0;
}

}  // namespace tessera::cli
