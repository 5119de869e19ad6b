#include "dra/node_plugin.h"

#include <fmt/core.h>

#include <chrono>

#include "base/prometheus.h"
#include "contract/host_layout.h"

namespace tessera::dra {
namespace {

// A health change reaches the slices within this, whatever else happens.
constexpr auto kHealthCheck = std::chrono::milliseconds(200);
constexpr auto kRetry = std::chrono::seconds(1);
// How often the slices on the API server are compared with the pool: one deleted or edited
// by someone else comes back within this.
constexpr auto kRecheck = std::chrono::seconds(30);

}  // namespace

DraNodePlugin::DraNodePlugin(DraPluginOptions options, node::NodeAgent& agent,
                             const kube::Cluster& cluster, base::Reporter report)
    : options_(std::move(options)),
      agent_(agent),
      cluster_(cluster),
      report_(std::move(report)),
      publisher_(cluster, options_.driver, options_.node_name) {}

DraNodePlugin::~DraNodePlugin() {
  stop();
}

GpuHealth DraNodePlugin::gpu_health() const {
  GpuHealth health;
  for (std::size_t gpu = 0; gpu < agent_.inventory().gpus.size(); ++gpu) {
    const int index = static_cast<int>(gpu);
    health.push_back(agent_.health().healthy(index)
                         ? ""
                         : (agent_.health().reason(index).empty() ? "unhealthy"
                                                                  : agent_.health().reason(index)));
  }
  return health;
}

void DraNodePlugin::start() {
  const contract::StateLayout layout(options_.state_dir);
  driver_ = std::make_unique<DraDriver>(
      DraDriverOptions{options_.driver, options_.node_name, options_.cdi_dir,
                       layout.dra_checkpoints()},
      agent_.inventory(), agent_.health(), agent_.grants(), cluster_,
      [this] { return agent_.served_config(); }, report_);
  driver_->restore();
  // The slices before the plugin: a kubelet that registers it finds the devices published.
  if (const base::Status published = publisher_.publish(agent_.inventory(), gpu_health(),
                                                        shared_defaults(agent_.served_config()));
      !published.ok()) {
    base::tell(report_, "dra: " + published.message() + " (retrying)");
  }
  server_ = std::make_unique<DraPluginServer>(options_.driver, options_.registry_dir,
                                              options_.plugins_dir, *driver_, report_);
  server_->start();
  base::tell(report_, fmt::format("dra: serving {} on {} (registration {})", options_.driver,
                                  server_->plugin_socket(), server_->registration_socket()));
  stopping_ = false;
  publisher_thread_ = std::thread([this] { publish_loop(); });
}

void DraNodePlugin::stop() {
  stopping_ = true;
  if (publisher_thread_.joinable()) publisher_thread_.join();
  if (server_ != nullptr) server_->stop();
  server_.reset();
}

void DraNodePlugin::publish_loop() {
  using Clock = std::chrono::steady_clock;
  std::uint64_t seen = agent_.changes().generation();
  auto next_try = Clock::now();
  auto next_recheck = Clock::now() + kRecheck;
  while (!stopping_) {
    seen = agent_.changes().wait(seen, kHealthCheck);
    if (stopping_ || Clock::now() < next_try) continue;
    if (Clock::now() >= next_recheck) {
      publisher_.recheck();
      next_recheck = Clock::now() + kRecheck;
    }
    if (const base::Status published = publisher_.publish(agent_.inventory(), gpu_health(),
                                                          shared_defaults(agent_.served_config()));
        !published.ok()) {
      base::tell(report_, "dra: " + published.message() + " (retrying)");
      next_try = Clock::now() + kRetry;
    }
    generation_ = publisher_.generation();
  }
}

std::string DraNodePlugin::metrics() const {
  base::Exposition out;
  out.family("tessera_dra_prepared_claims", "gauge",
             "Claims prepared on this node and not yet unprepared");
  out.add("tessera_dra_prepared_claims", "", static_cast<double>(driver_->prepared()));
  out.family("tessera_dra_prepare_calls_total", "counter",
             "NodePrepareResources answers per claim, by result");
  out.add("tessera_dra_prepare_calls_total", "result=\"prepared\"",
          static_cast<double>(driver_->answers_prepared()));
  out.add("tessera_dra_prepare_calls_total", "result=\"refused\"",
          static_cast<double>(driver_->answers_refused()));
  out.family("tessera_dra_pool_generation", "gauge",
             "The generation of this node's ResourceSlice pool last published");
  out.add("tessera_dra_pool_generation", "", static_cast<double>(generation_.load()));
  out.family("tessera_dra_registered", "gauge", "Whether the kubelet registered the DRA plugin");
  out.add("tessera_dra_registered", "", server_ != nullptr && server_->registered() ? 1 : 0);
  return out.text();
}

}  // namespace tessera::dra
