#include "node/agent.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <set>

#include "base/files.h"
#include "contract/annotations.h"
#include "contract/gpu_numbering.h"
#include "node/compute_policy.h"
#include "node/mig_gpu.h"

namespace tessera::node {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kConfigPoll = std::chrono::seconds(2);  // a missed file event is caught by then
constexpr auto kRegistrationRetry = std::chrono::seconds(1);

}  // namespace

NodeAgent::NodeAgent(NodeAgentOptions options)
    : options_(std::move(options)), metrics_renderer_(contract::StateLayout(options_.state_dir)) {
  if (!options_.report) options_.report = [](const std::string&) {};
}

NodeAgent::~NodeAgent() {
  stop();
}

void NodeAgent::say(const std::string& text) const {
  base::tell(options_.report, text);
}

std::shared_ptr<const NodeAgent::Served> NodeAgent::served() const {
  base::MutexLock locked(state_mutex_);
  return served_;
}

PluginConfig NodeAgent::served_config() const {
  return served()->config;
}

std::uint64_t NodeAgent::config_generation() const {
  base::MutexLock locked(state_mutex_);
  return generation_;
}

std::string NodeAgent::config_error() const {
  base::MutexLock locked(state_mutex_);
  return config_error_;
}

ConfigSet NodeAgent::read_configs() const {
  if (!options_.config_dir.empty()) return read_config_directory(options_.config_dir);
  if (!options_.config_file.empty()) {
    return read_config_file(options_.config_file,
                            options_.config_name.empty() ? "default" : options_.config_name);
  }
  ConfigSet set;
  set.configs["default"] = default_plugin_config();
  return set;
}

void NodeAgent::start() {
  nvml_ = std::make_unique<Nvml>(options_.nvml_library);
  inventory_ = read_inventory(*nvml_);
  add_mig_devices(*nvml_, inventory_);
  health_.resize(static_cast<int>(inventory_.gpus.size()));
  say(fmt::format("{} GPU(s){}, driver {}, CUDA {}.{}", inventory_.gpus.size(),
                  inventory_.simulated ? " (simulated)" : "", inventory_.driver_version,
                  inventory_.cuda_major, inventory_.cuda_minor));

  std::error_code error;
  fs::create_directories(options_.device_plugin_dir, error);
  const contract::StateLayout layout(options_.state_dir);
  std::unique_ptr<PodResourcesClient> kubelet;
  if (options_.cluster != nullptr && !options_.pod_resources_socket.empty()) {
    kubelet = std::make_unique<PodResourcesClient>(options_.pod_resources_socket);
  }
  grants_ = std::make_unique<ContainerGrants>(layout, options_.cluster.get(), options_.node_name,
                                              std::move(kubelet),
                                              [this](const std::string& text) { say(text); });
  grants_->prepare(inventory_);
  if (!options_.hook_library.empty())
    base::install_file(options_.hook_library, layout.hook_library());

  // No other thread runs yet; the locks are taken for the rules they state.
  base::MutexLock reloading(reload_mutex_);
  const std::string label = read_node_label();

  // The first config must be good: there is nothing older to keep serving.
  const ConfigSet set = read_configs();
  PluginConfig config = choose_config(set, {label, options_.config_name});
  {
    base::MutexLock locked(state_mutex_);
    node_label_ = label;
  }
  for (const std::string& field : config.ignored)
    say(fmt::format("{}: {} is accepted and not acted on", config.origin, field));
  auto first = std::make_shared<Served>(Served{std::make_shared<const Inventory>(inventory_),
                                               config, build_resource_map(inventory_, config)});
  for (const std::string& note : first->map.notes) say(note);
  apply(first);

  threads_.emplace_back([this] { watch_kubelet(); });
  threads_.emplace_back([this] { watch_config(); });
  threads_.emplace_back([this] { publish_loop(); });
  if (options_.cluster != nullptr) threads_.emplace_back([this] { watch_node(); });
}

void NodeAgent::stop() {
  if (stopping_.exchange(true)) return;
  publish_wanted_.notify_all();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  {
    base::MutexLock reloading(reload_mutex_);
    monitor_.reset();
    mps_.reset();  // its daemons are told to quit
  }
  base::MutexLock locked(servers_mutex_);
  servers_.clear();  // each stops and removes its socket
}

bool NodeAgent::reload() {
  base::MutexLock reloading(reload_mutex_);
  std::string label;
  {
    base::MutexLock locked(state_mutex_);
    label = node_label_;
  }
  try {
    const ConfigSet set = read_configs();
    PluginConfig config = choose_config(set, {label, options_.config_name});
    const auto current = served();
    auto next = std::make_shared<Served>(
        Served{current->inventory, config, build_resource_map(*current->inventory, config)});
    {
      base::MutexLock locked(state_mutex_);
      config_error_.clear();
    }
    bool same = current != nullptr && current->config.name == config.name &&
                current->config.text == config.text &&
                current->map.resources.size() == next->map.resources.size();
    for (std::size_t i = 0; same && i < next->map.resources.size(); ++i) {
      same = current->map.resources[i].signature() == next->map.resources[i].signature();
    }
    if (same) {
      request_publish();  // a refusal shown on the node is cleared
      return true;
    }
    for (const std::string& note : next->map.notes) say(note);
    say(fmt::format("applying config '{}' ({})", config.name, config.origin));
    apply(next);
    return true;
  } catch (const std::exception& refused) {
    {
      base::MutexLock locked(state_mutex_);
      config_error_ = refused.what();
      ++reload_errors_;
    }
    say(fmt::format("config refused, the last good one keeps serving: {}", refused.what()));
    request_publish();
    return false;
  }
}

void NodeAgent::apply(std::shared_ptr<const Served> next) {
  // The GPUs' time slice first: the kubelet may hear of the new config's devices as soon as
  // it is the one served (a health change sends the list), and they run under its slice.
  const int timeslice = next->config.flags.compute_timeslice;
  if (timeslice >= 0 && timeslice != applied_timeslice_) {
    if (apply_compute_timeslice(options_.nvidia_smi, *next->inventory, timeslice,
                                [this](const std::string& text) { say(text); })) {
      applied_timeslice_ = timeslice;
    }
  }
  {
    base::MutexLock locked(state_mutex_);
    served_ = next;
    ++generation_;
  }
  restart_health(*next);
  // The MPS daemons first: a resource is served once its daemon answers.
  const std::vector<MpsDaemonSpec> daemons =
      mps_daemon_specs(*next->inventory, next->config, next->map);
  if (mps_ == nullptr && !daemons.empty()) {
    mps_ = std::make_unique<MpsSupervisor>(
        options_.mps_control, health_,
        [this] {
          changes_.notify();
          request_publish();
        },
        [this](const std::string& text) { say(text); }, options_.mps_check_every);
  }
  if (mps_ != nullptr) mps_->apply(daemons);
  // The node's labels describe what is served before the kubelet sees it (the publish loop
  // keeps them current after).
  if (!options_.features_dir.empty()) {
    try {
      write_features_file(options_.features_dir,
                          gpu_labels(*next->inventory, next->config, std::time(nullptr)));
    } catch (const std::exception& failure) {
      say(failure.what());
    }
  }
  std::set<std::string> wanted;
  if (options_.serve_device_plugins) {
    for (const Resource& resource : next->map.resources) wanted.insert(resource.name);
  }
  base::MutexLock locked(servers_mutex_);
  for (auto it = servers_.begin(); it != servers_.end();) {
    if (wanted.count(it->first) == 0) {
      say(fmt::format("{} is no longer served", it->first));
      unregistered_.erase(std::remove(unregistered_.begin(), unregistered_.end(), it->first),
                          unregistered_.end());
      it = servers_.erase(it);  // stops serving and removes the socket: the kubelet drops it
    } else {
      ++it;
    }
  }
  for (const std::string& name : wanted) {
    if (servers_.count(name) > 0) continue;
    auto server = make_server(name);
    try {
      server->start();
    } catch (const std::exception& failure) {  // the rest of the config still applies
      say(fmt::format("{} cannot be served: {}", name, failure.what()));
      continue;
    }
    if (const base::Status registered = server->register_with_kubelet(); !registered.ok()) {
      say(registered.message() + " (retrying)");
      unregistered_.push_back(name);
    } else {
      say(fmt::format("serving {} on {}", name, server->socket_path()));
    }
    servers_[name] = std::move(server);
  }
  changes_.notify();  // resources kept but changed send their new list
  request_publish();
}

std::unique_ptr<DevicePluginServer> NodeAgent::make_server(const std::string& resource) {
  PluginCallbacks callbacks;
  callbacks.list = [this, resource] { return devices_of(resource); };
  callbacks.prefer = [this, resource](const std::vector<std::string>& available,
                                      const std::vector<std::string>& required, int size) {
    const auto state = served();
    const Resource* served_resource = state->map.find(resource);
    if (served_resource == nullptr) throw AllocationError(resource + " is no longer served");
    return grants_->prefer(*state->inventory, *served_resource, available, required, size,
                           scheduler_numbering(*state), [&] {
                             return preferred_allocation(*served_resource, available, required,
                                                         size, options_.replica_policy);
                           });
  };
  // With a cluster, the kubelet calls PreStartContainer before each container of every
  // resource starts: a container of slices gets its limits there (container_grants.h).
  callbacks.pre_start_required = options_.cluster != nullptr;
  callbacks.pre_start = [this, resource](const std::vector<std::string>& ids) {
    const auto state = served();
    const Resource* served_resource = state->map.find(resource);
    if (served_resource == nullptr) throw AllocationError(resource + " is no longer served");
    grants_->pre_start(*state->inventory, *served_resource, ids, scheduler_numbering(*state));
  };
  callbacks.allocate = [this, resource](const std::vector<std::string>& ids) {
    return allocate(resource, ids);
  };
  return std::make_unique<DevicePluginServer>(resource, options_.device_plugin_dir,
                                              std::move(callbacks), changes_);
}

std::vector<PluginDevice> NodeAgent::devices_of(const std::string& resource) const {
  std::vector<PluginDevice> devices;
  const auto state = served();
  const Resource* served_resource = state == nullptr ? nullptr : state->map.find(resource);
  if (served_resource == nullptr) return devices;
  for (const AdvertisedDevice& device : served_resource->devices) {
    devices.push_back({device.id, health_.healthy(device.gpu), device.numa_node});
  }
  return devices;
}

ContainerAllocation NodeAgent::allocate(const std::string& resource,
                                        const std::vector<std::string>& ids) {
  const auto state = served();
  const Resource* served_resource = state->map.find(resource);
  if (served_resource == nullptr) {
    throw AllocationError(fmt::format("{} is no longer served on this node", resource));
  }
  if (limited_kind(served_resource->kind)) {
    return grants_->allocate(*state->inventory, state->config, *served_resource, ids, health_);
  }
  ContainerAllocation allocation = expose_devices(
      *state->inventory, state->config, requested_devices(*served_resource, ids), random_uuid());
  if (served_resource->mps) {
    add_mps_access(allocation, state->config, resource);
    const ContainerGrant grant = mps_container_grant(*state->inventory, *served_resource, ids);
    say(fmt::format(
        "mps: {} on GPU(s) {}: {} for all the container's processes", fmt::join(ids, ","),
        fmt::format("{}", fmt::join(grant.gpus, ",")),
        grants_->add_ledger(allocation, *state->inventory, *served_resource, ids, grant)));
  }
  return allocation;
}

void NodeAgent::restart_health(const Served& next) {
  const PluginConfig& config = next.config;
  if (monitor_ != nullptr && monitor_settings_ == config.health &&
      monitor_inventory_ == next.inventory) {
    return;
  }
  monitor_.reset();
  monitor_settings_ = config.health;
  monitor_inventory_ = next.inventory;
  monitor_ = std::make_unique<HealthMonitor>(
      *nvml_, *next.inventory,
      health_policy(config.health, std::getenv("DP_DISABLE_HEALTHCHECKS"),
                    std::getenv("DP_ENABLE_HEALTHCHECKS"), options_.recovery_quiet),
      health_,
      [this] {
        changes_.notify();
        request_publish();
      },
      [this](const std::string& text) { say(text); });
}

void NodeAgent::register_all(bool restart_servers) {
  base::MutexLock locked(servers_mutex_);
  if (restart_servers) unregistered_.clear();
  for (auto& [name, server] : servers_) {
    if (!restart_servers &&
        std::find(unregistered_.begin(), unregistered_.end(), name) == unregistered_.end()) {
      continue;
    }
    try {
      if (restart_servers) server->start();  // the kubelet removed the old socket
    } catch (const std::exception& failure) {
      say(failure.what());
    }
    if (!server->register_with_kubelet().ok()) {
      if (std::find(unregistered_.begin(), unregistered_.end(), name) == unregistered_.end()) {
        unregistered_.push_back(name);
      }
      continue;
    }
    unregistered_.erase(std::remove(unregistered_.begin(), unregistered_.end(), name),
                        unregistered_.end());
    say(fmt::format("registered {} with the kubelet", name));
  }
}

void NodeAgent::watch_kubelet() {
  base::DirectoryWatch events(options_.device_plugin_dir, IN_CREATE | IN_MOVED_TO);
  if (!events.watching())
    say(fmt::format("cannot watch {}; a kubelet restart is noticed by polling",
                    options_.device_plugin_dir));
  auto socket_inode = [this] {
    struct stat info {};
    return stat((options_.device_plugin_dir + "/" + kKubeletSocket).c_str(), &info) == 0
               ? info.st_ino
               : 0;
  };
  ino_t known = socket_inode();
  auto last_retry = Clock::now();
  while (!stopping_) {
    const std::vector<std::string> names = events.wait(std::chrono::milliseconds(100));
    const bool recreated = std::find(names.begin(), names.end(), kKubeletSocket) != names.end() ||
                           (socket_inode() != known && socket_inode() != 0);
    if (recreated) {
      known = socket_inode();
      say("the kubelet's socket was created anew: registering again");
      register_all(true);
      last_retry = Clock::now();
      continue;
    }
    bool pending = false;
    {
      base::MutexLock locked(servers_mutex_);
      pending = !unregistered_.empty();
    }
    if (pending && Clock::now() - last_retry >= kRegistrationRetry) {
      register_all(false);
      last_retry = Clock::now();
    }
  }
}

void NodeAgent::watch_config() {
  std::string directory = options_.config_dir;
  if (directory.empty() && !options_.config_file.empty()) {
    directory = fs::path(options_.config_file).parent_path().string();
    if (directory.empty()) directory = ".";
  }
  if (directory.empty()) return;  // the built-in default: nothing to watch
  base::DirectoryWatch events(
      directory, IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_ATTRIB);
  std::string seen = config_source_fingerprint(options_.config_dir, options_.config_file);
  auto last_poll = Clock::now();
  while (!stopping_) {
    const std::vector<std::string> names = events.wait(std::chrono::milliseconds(200));
    if (names.empty() && Clock::now() - last_poll < kConfigPoll) continue;
    last_poll = Clock::now();
    std::string now = config_source_fingerprint(options_.config_dir, options_.config_file);
    if (now == seen) continue;
    seen = std::move(now);
    reload();
  }
}

std::string NodeAgent::metrics() {
  AgentStatus status;
  status.hostname = options_.node_name;
  const auto state = served();
  status.inventory = state->inventory.get();
  status.health = &health_;
  status.xids = health_.events();
  {
    base::MutexLock locked(servers_mutex_);
    for (const auto& [name, server] : servers_) {
      AgentStatus::Served& entry = status.resources[name];
      entry.allocations = server->allocations();
      entry.refusals = server->refusals();
    }
  }
  for (const Resource& resource : state->map.resources) {
    AgentStatus::Served& entry = status.resources[resource.name];
    entry.devices = resource.devices.size();
    for (const AdvertisedDevice& device : resource.devices)
      entry.healthy += health_.healthy(device.gpu);
  }
  {
    base::MutexLock locked(state_mutex_);
    status.config_generation = generation_;
    status.reload_errors = reload_errors_;
    status.config_refused = !config_error_.empty();
  }
  status.config_name = state->config.name;
  status.assignments_rewritten = grants_->assignments_rewritten();
  return metrics_renderer_.render(status);
}

}  // namespace tessera::node
