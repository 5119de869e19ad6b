#include "dra/slice_publisher.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>

#include "kube/json_input.h"

namespace tessera::dra {
namespace {

using nlohmann::json;

constexpr auto kCallBudget = std::chrono::seconds(5);

kube::Deadline deadline() {
  return std::chrono::steady_clock::now() + kCallBudget;
}

// The fields this driver writes only sometimes (a taint while a GPU is unhealthy): where it
// does not want one, the API server must not hold one.
constexpr std::array<const char*, 4> kSometimesWritten = {"taints", "allowMultipleAllocations",
                                                          "consumesCounters", "requestPolicy"};

// Whether `have` says what `want` does: the API server adds defaults and timestamps of its own
// (a taint's timeAdded) to what was written, but holds none of the sometimes-written fields
// that `want` lacks.
bool covers(const json& have, const json& want) {
  if (want.is_object()) {
    if (!have.is_object()) return false;
    for (const auto& [key, value] : want.items()) {
      if (!have.contains(key) || !covers(have[key], value)) return false;
    }
    for (const char* field : kSometimesWritten) {
      if (have.contains(field) && !want.contains(field)) return false;
    }
    return true;
  }
  if (want.is_array()) {
    if (!have.is_array() || have.size() != want.size()) return false;
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (!covers(have[i], want[i])) return false;
    }
    return true;
  }
  return have == want;
}

std::string why(const kube::ApiResponse& response) {
  return response.status == 0 ? response.error : fmt::format("HTTP {}", response.status);
}

}  // namespace

SlicePublisher::SlicePublisher(const kube::Cluster& cluster, std::string driver, std::string node)
    : cluster_(cluster), driver_(std::move(driver)), node_(std::move(node)) {}

std::string SlicePublisher::slice_name(std::size_t index) const {
  // A DNS subdomain of at most 253 characters whatever the node's name.
  return fmt::format("{}-{}-{}", node_.substr(0, 200), driver_, index);
}

base::Status SlicePublisher::publish(const node::Inventory& inventory, const GpuHealth& health,
                                     const SharedDefaults& defaults) {
  const std::vector<json> wanted = pool_slices(inventory, health, defaults, node_, 0);
  if (current_ && wanted == published_) return base::Status::success();
  current_ = false;

  const kube::ApiResponse listed = cluster_.list_resource_slices(driver_, node_, deadline());
  if (listed.status != 200) {
    return base::Status::failure(
        fmt::format("cannot list the ResourceSlices of {}: {}", node_, why(listed)));
  }
  std::map<std::string, json> existing;
  std::int64_t newest = generation_;
  try {
    const json list = kube::parse_outside_json(listed.body);
    for (const json& item : list.at("items")) {
      const std::string name = kube::string_at(item, "/metadata/name"_json_pointer);
      const json* generation = &item;
      for (const char* key : {"spec", "pool", "generation"}) {
        generation =
            generation->is_object() && generation->contains(key) ? &(*generation)[key] : nullptr;
        if (generation == nullptr) break;
      }
      if (generation != nullptr && generation->is_number_integer()) {
        newest = std::max(newest, generation->get<std::int64_t>());
      }
      if (!name.empty()) existing[name] = item;
    }
  } catch (const std::exception& unreadable) {
    return base::Status::failure(
        fmt::format("the ResourceSlices of {} cannot be read: {}", node_, unreadable.what()));
  }
  // What the API server holds says this pool already (after a restart, or at a recheck):
  // nothing to write.
  if (existing.size() == wanted.size()) {
    const std::vector<json> held = pool_slices(inventory, health, defaults, node_, newest);
    bool same = true;
    for (std::size_t index = 0; same && index < held.size(); ++index) {
      const auto found = existing.find(slice_name(index));
      same = found != existing.end() && found->second.contains("spec") &&
             covers(found->second["spec"], held[index]);
    }
    if (same) {
      generation_ = newest;
      published_ = wanted;
      current_ = true;
      return base::Status::success();
    }
  }
  const std::int64_t generation = newest + 1;
  const std::vector<json> specs = pool_slices(inventory, health, defaults, node_, generation);
  for (std::size_t index = 0; index < specs.size(); ++index) {
    const std::string name = slice_name(index);
    const json object = {{"apiVersion", "resource.k8s.io/v1"},
                         {"kind", "ResourceSlice"},
                         {"metadata", {{"name", name}}},
                         {"spec", specs[index]}};
    const bool exists = existing.erase(name) > 0;
    const kube::ApiResponse written =
        exists ? cluster_.replace_resource_slice(name, object, deadline())
               : cluster_.create_resource_slice(object, deadline());
    if (written.status != 200 && written.status != 201) {
      return base::Status::failure(fmt::format("cannot {} ResourceSlice {}: {}",
                                               exists ? "replace" : "create", name, why(written)));
    }
  }
  for (const auto& [name, stale] : existing) {
    const kube::ApiResponse removed = cluster_.delete_resource_slice(name, deadline());
    if (removed.status != 200 && removed.status != 404) {
      return base::Status::failure(
          fmt::format("cannot delete ResourceSlice {}: {}", name, why(removed)));
    }
  }
  generation_ = generation;
  published_ = wanted;
  current_ = true;
  return base::Status::success();
}

}  // namespace tessera::dra
