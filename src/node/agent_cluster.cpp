// The node agent's side of the API server: the node's config label, read at start and
// watched; the labels and annotations it publishes on the node (GPU Feature Discovery's
// labels, the GPUs annotation the scheduler reads, the config in force); and the ledgers of
// pods gone, collected against the pods the API server lists on this node.
#include <fmt/core.h>

#include <algorithm>
#include <ctime>
#include <optional>
#include <set>

#include "contract/annotations.h"
#include "contract/gpu_numbering.h"
#include "kube/json_input.h"
#include "kube/objects.h"
#include "kube/reflector.h"
#include "node/agent.h"

namespace tessera::node {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kCollectEvery = std::chrono::seconds(60);  // ledgers of pods gone
constexpr auto kPublishRetry = std::chrono::seconds(5);

std::string node_label_of(const nlohmann::json& node) {
  const nlohmann::json* label = kube::find_at(node, {"metadata", "labels", contract::kConfigLabel});
  return label != nullptr && label->is_string() ? label->get<std::string>() : std::string();
}

}  // namespace

std::string NodeAgent::read_node_label() {
  std::string label;
  if (options_.cluster != nullptr) {
    const kube::ApiResponse node =
        options_.cluster->get_node(options_.node_name, kube::Deadline::max());
    if (node.status == 200) {
      try {
        label = node_label_of(kube::parse_outside_json(node.body));
      } catch (const std::exception& failure) {
        say(fmt::format("node {} cannot be read: {}", options_.node_name, failure.what()));
      }
    } else {
      say(
          fmt::format("node {} cannot be read (HTTP {} {}); its config label is read once the "
                      "API server answers",
                      options_.node_name, node.status, node.error));
    }
  } else {
    say(
        fmt::format("no API server: serving the kubelet from the config alone; node labels, the {} "
                    "annotation and the limits of slices' pods need one",
                    contract::kGpusAnnotation));
  }
  return label;
}

void NodeAgent::watch_node() {
  auto take = [this](const nlohmann::json& node) {
    const std::string label = node.is_null() ? std::string() : node_label_of(node);
    const nlohmann::json* wanted =
        node.is_null()
            ? nullptr
            : kube::find_at(node, {"metadata", "annotations", contract::kMigLayoutAnnotation});
    const std::string layout =
        wanted != nullptr && wanted->is_string() ? wanted->get<std::string>() : std::string();
    bool changed = false, layout_changed = false;
    {
      base::MutexLock locked(state_mutex_);
      changed = label != node_label_;
      node_label_ = label;
      layout_changed = layout != mig_layout_;
      mig_layout_ = layout;
    }
    if (changed) {
      say(fmt::format("node label {} is now '{}'", contract::kConfigLabel, label));
      reload();
    }
    if (layout_changed && !layout.empty()) apply_wanted_mig_layout(layout);
  };
  kube::CollectionHandlers handlers;
  handlers.replace = [&](const nlohmann::json& items) {
    for (const auto& item : items) {
      if (kube::string_at(item, "/metadata/name"_json_pointer) == options_.node_name) take(item);
    }
  };
  handlers.apply = [&](std::string_view type, const nlohmann::json& object) {
    if (kube::string_at(object, "/metadata/name"_json_pointer) != options_.node_name) return;
    take(type == "DELETED" ? nlohmann::json() : object);
  };
  kube::follow_collection(*options_.cluster, kube::Collection::node_named(options_.node_name),
                          handlers, stopping_, [this](const std::string& text) { say(text); });
}

void NodeAgent::request_publish() {
  {
    base::MutexLock locked(publish_mutex_);
    publish_pending_ = true;
  }
  publish_wanted_.notify_all();
}

void NodeAgent::publish_loop() {
  auto last_collect = Clock::now();
  std::time_t applied_at = std::time(nullptr);
  std::uint64_t labelled_generation = 0;
  // The MIG instances pods held when the node was last annotated: the kubelet records a
  // container's devices only after Allocate, so the holds are read again at every wake-up
  // (kPublishRetry) and a change is published.
  std::optional<HeldInstances> published_held;
  while (!stopping_) {
    bool due = false;
    {
      const auto deadline = Clock::now() + kPublishRetry;
      base::MutexLock locked(publish_mutex_);
      while (!publish_pending_ && !stopping_ &&
             publish_wanted_.wait_until(publish_mutex_, deadline)) {
      }
      if (stopping_) return;
      due = publish_pending_ || Clock::now() - last_collect >= kCollectEvery;
      publish_pending_ = false;
    }
    const auto state = served();
    // A coordination file written over is made whole for the containers using it.
    grants_->repair_coordination(*state->inventory);
    // Which MIG instances pods hold, for the scheduler's re-cut plans; left out when the
    // kubelet cannot say (the node checks again before it changes anything).
    std::optional<HeldInstances> held;
    const bool any_mig = std::any_of(state->inventory->gpus.begin(), state->inventory->gpus.end(),
                                     [](const GpuInfo& gpu) { return !gpu.mig_devices.empty(); });
    if (any_mig && options_.serve_device_plugins && options_.cluster != nullptr) {
      try {
        held = held_mig_instances(*state);
      } catch (const std::runtime_error&) {  // unknown: published without
      }
    }
    due = due || held != published_held;
    if (!due) continue;
    std::string error, mig_state;
    std::uint64_t generation = 0;
    {
      base::MutexLock locked(state_mutex_);
      error = config_error_;
      mig_state = mig_layout_state_;
      generation = generation_;
    }
    if (generation != labelled_generation) {  // GFD's timestamp: when the config took effect
      applied_at = std::time(nullptr);
      labelled_generation = generation;
    }
    const Labels labels = gpu_labels(*state->inventory, state->config, applied_at);
    bool failed = false;
    if (!options_.features_dir.empty()) {
      try {
        write_features_file(options_.features_dir, labels);
      } catch (const std::exception& failure) {
        say(failure.what());
        failed = true;
      }
    }
    if (options_.cluster != nullptr) {
      nlohmann::json patch_labels = nlohmann::json::object();
      for (const auto& [key, value] : labels) patch_labels[key] = value;
      for (const auto& [key, value] : published_labels_) {
        if (labels.count(key) == 0) patch_labels[key] = nullptr;
      }
      const nlohmann::json annotation =
          gpus_annotation(*state->inventory, state->map, health_, state->config.strategy(),
                          held ? &*held : nullptr);
      nlohmann::json patch{
          {"metadata",
           {{"labels", patch_labels},
            {"annotations",
             {{contract::kGpusAnnotation, kube::dump_outside_json(annotation)},
              {contract::kConfigAnnotation, state->config.name},
              {contract::kConfigErrorAnnotation,
               error.empty() ? nlohmann::json() : nlohmann::json(error.substr(0, 4096))},
              {contract::kMigLayoutStateAnnotation,
               mig_state.empty() ? nlohmann::json()
                                 : nlohmann::json(mig_state.substr(0, 4096))}}}}}};
      const kube::ApiResponse answer =
          options_.cluster->patch_node(options_.node_name, patch, kube::Deadline::max());
      if (answer.status == 200) {
        published_labels_ = labels;
        published_held = held;
      } else {
        say(fmt::format("node {}: labels and annotations not written: HTTP {} {}",
                        options_.node_name, answer.status,
                        answer.status == 0 ? answer.error : answer.body.substr(0, 300)));
        failed = true;
      }
      if (Clock::now() - last_collect >= kCollectEvery) {
        last_collect = Clock::now();
        const kube::ApiResponse pods = options_.cluster->list(
            kube::Collection::pods_on_node(options_.node_name), kube::Deadline::max());
        if (pods.status == 200) {
          try {
            std::set<std::string> uids;
            const nlohmann::json body = kube::parse_outside_json(pods.body);
            if (const nlohmann::json* items = kube::find_at(body, {"items"});
                items != nullptr && items->is_array()) {
              for (const auto& pod : *items)
                uids.insert(kube::string_at(pod, "/metadata/uid"_json_pointer));
              const int removed = grants_->collect(uids);
              if (removed > 0) say(fmt::format("removed {} ledger(s) of containers gone", removed));
            }
          } catch (const std::exception& failure) {
            say(fmt::format("this node's pods cannot be read: {}", failure.what()));
          }
        }
      }
    }
    if (failed) {  // tried again after kPublishRetry
      const auto deadline = Clock::now() + kPublishRetry;
      base::MutexLock locked(publish_mutex_);
      while (!stopping_ && publish_wanted_.wait_until(publish_mutex_, deadline)) {
      }
      publish_pending_ = true;
    }
  }
}

std::vector<std::string> NodeAgent::scheduler_numbering(const Served& state) const {
  return contract::scheduler_numbering(
      gpus_annotation(*state.inventory, state.map, health_, state.config.strategy())["gpus"]);
}

}  // namespace tessera::node
