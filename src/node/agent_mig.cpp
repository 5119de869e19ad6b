// The node agent's side of dynamic MIG: the tessera.io/mig-layout annotation applied to the
// GPUs (node/mig_layout.h), the GPUs read again, and their devices served anew.
#include <fmt/core.h>

#include "contract/annotations.h"
#include "node/agent.h"
#include "node/mig_gpu.h"
#include "node/pod_resources.h"

namespace tessera::node {

HeldInstances NodeAgent::held_mig_instances(const Served& state) const {
  std::vector<KubeletPod> pods;
  if (const base::Status listed = PodResourcesClient(options_.pod_resources_socket).list(pods);
      !listed.ok()) {
    throw std::runtime_error("the kubelet cannot say which MIG devices pods hold: " +
                             listed.message());
  }
  HeldInstances held;
  for (const KubeletPod& pod : pods) {
    for (const KubeletContainer& container : pod.containers) {
      for (const auto& [name, ids] : container.devices) {
        const Resource* resource = state.map.find(name);
        if (resource == nullptr) continue;
        for (const std::string& id : ids) {
          const AdvertisedDevice* device = resource->find(id);
          if (device == nullptr || device->mig < 0) continue;
          const GpuInfo& gpu = state.inventory->gpus[static_cast<std::size_t>(device->gpu)];
          held.insert(
              {gpu.index, gpu.mig_devices[static_cast<std::size_t>(device->mig)].gpu_instance});
        }
      }
    }
  }
  return held;
}

void NodeAgent::apply_wanted_mig_layout(const std::string& text) {
  base::MutexLock reloading(reload_mutex_);
  std::string state;
  try {
    if (!options_.serve_device_plugins) {
      throw std::runtime_error(
          "this node hands out its GPUs through DRA, where the annotation changes nothing");
    }
    WantedMigLayout wanted;
    try {
      wanted = parse_mig_layout(text);
    } catch (const std::invalid_argument& bad) {
      throw std::runtime_error(
          fmt::format("{} is not a layout: {}", contract::kMigLayoutAnnotation, bad.what()));
    }
    const auto current = served();
    const std::string done =
        apply_mig_layout(*nvml_, *current->inventory, wanted, held_mig_instances(*current));
    say("MIG layout applied: " + done);
    Inventory read = read_inventory(*nvml_);
    add_mig_devices(*nvml_, read);
    auto inventory = std::make_shared<const Inventory>(std::move(read));
    apply(std::make_shared<Served>(
        Served{inventory, current->config, build_resource_map(*inventory, current->config)}));
    state = "success";
  } catch (const std::exception& failure) {
    state = std::string("failed: ") + failure.what();
    say(fmt::format("MIG layout not applied: {}", failure.what()));
  }
  {
    base::MutexLock locked(state_mutex_);
    mig_layout_state_ = state;
  }
  request_publish();
}

}  // namespace tessera::node
