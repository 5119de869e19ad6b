#include "memory_cluster.h"

namespace tessera::test {
namespace {

using kube::ApiResponse;

ApiResponse answer(long status, const nlohmann::json& body) {
  return {status, body.dump(), {}};
}
ApiResponse refusal(long status) {
  if (status == 0) return {0, {}, "the API server does not answer"};
  return answer(status, {{"kind", "Status"}, {"code", status}});
}

// Whether `object` is one of `collection`: its field selector, if it has one.
bool selected(const kube::Collection& collection, const nlohmann::json& object) {
  if (collection.node.empty()) return true;
  const auto at = collection.kind == kube::Collection::Kind::nodes ? "/metadata/name"_json_pointer
                                                                   : "/spec/nodeName"_json_pointer;
  return object.contains(at) && object[at] == collection.node;
}

const char* kind_of(const kube::Collection& collection) {
  return collection.kind == kube::Collection::Kind::nodes ? "nodes" : "pods";
}

}  // namespace

std::string InMemoryCluster::key_of(const std::string& kind, const nlohmann::json& object) {
  const std::string name = object["metadata"]["name"].get<std::string>();
  if (kind == "nodes" || kind == "resourceslices" || kind == "deviceclasses") return name;
  return object["metadata"].value("namespace", std::string("default")) + "/" + name;
}

void InMemoryCluster::stamp(nlohmann::json& object) const {
  object["metadata"]["resourceVersion"] = std::to_string(++version_);
}

void InMemoryCluster::record(const std::string& kind, const std::string& type,
                             const nlohmann::json& object) const {
  events_.push_back({version_, kind, type, object});
  changed_.notify_all();
}

void InMemoryCluster::put(const std::string& kind, nlohmann::json object) {
  base::MutexLock locked(mutex_);
  const std::string key = key_of(kind, object);
  if (kind == "pods" && !object["metadata"].contains("uid")) {
    object["metadata"]["uid"] = "uid-" + object["metadata"]["name"].get<std::string>();
  }
  if (!object["metadata"].contains("creationTimestamp")) {
    object["metadata"]["creationTimestamp"] =
        "2026-12-03T10:00:" + std::to_string(10 + version_ % 50) + "Z";
  }
  const bool existed = objects_[kind].count(key) > 0;
  stamp(object);
  objects_[kind][key] = object;
  record(kind, existed ? "MODIFIED" : "ADDED", object);
}

bool InMemoryCluster::erase(const std::string& kind, const std::string& key) const {
  auto found = objects_[kind].find(key);
  if (found == objects_[kind].end()) return false;
  nlohmann::json object = found->second;
  objects_[kind].erase(found);
  stamp(object);
  record(kind, "DELETED", object);
  return true;
}

void InMemoryCluster::remove(const std::string& kind, const std::string& key) {
  base::MutexLock locked(mutex_);
  erase(kind, key);
}

void InMemoryCluster::patch(const std::string& kind, const std::string& key,
                            const nlohmann::json& patch) {
  base::MutexLock locked(mutex_);
  nlohmann::json& object = objects_[kind].at(key);
  object.merge_patch(patch);
  stamp(object);
  record(kind, "MODIFIED", object);
}

std::optional<nlohmann::json> InMemoryCluster::get(const std::string& kind,
                                                   const std::string& key) const {
  base::MutexLock locked(mutex_);
  const auto collection = objects_.find(kind);
  if (collection == objects_.end()) return std::nullopt;
  const auto found = collection->second.find(key);
  if (found == collection->second.end()) return std::nullopt;
  return found->second;
}

bool InMemoryCluster::wait_for(const std::string& kind, const std::string& key,
                               const std::function<bool(const nlohmann::json&)>& ready,
                               std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  base::MutexLock locked(mutex_);
  while (true) {
    const auto found = objects_[kind].find(key);
    if (found != objects_[kind].end() && ready(found->second)) return true;
    if (!changed_.wait_until(mutex_, deadline)) return false;
  }
}

void InMemoryCluster::fail_writes_with(long status) {
  base::MutexLock locked(mutex_);
  write_status_ = status;
}

ApiResponse InMemoryCluster::read(const std::string& kind, const std::string& key) const {
  const std::optional<nlohmann::json> found = get(kind, key);
  return found ? answer(200, *found) : refusal(404);
}

ApiResponse InMemoryCluster::merge(const std::string& kind, const std::string& key,
                                   nlohmann::json patch) const {
  base::MutexLock locked(mutex_);
  if (write_status_ != 200) return refusal(write_status_);
  auto found = objects_[kind].find(key);
  if (found == objects_[kind].end()) return refusal(404);
  // A merge patch naming a version answers 409 unless it is the object's.
  if (patch.contains("metadata") && patch["metadata"].contains("resourceVersion")) {
    if (patch["metadata"]["resourceVersion"] != found->second["metadata"]["resourceVersion"]) {
      return refusal(409);
    }
    patch["metadata"].erase("resourceVersion");
  }
  found->second.merge_patch(patch);
  stamp(found->second);
  record(kind, "MODIFIED", found->second);
  return answer(200, found->second);
}

ApiResponse InMemoryCluster::get_node(const std::string& name, kube::Deadline) const {
  return read("nodes", name);
}
ApiResponse InMemoryCluster::patch_node(const std::string& name, const nlohmann::json& patch,
                                        kube::Deadline) const {
  return merge("nodes", name, patch);
}
ApiResponse InMemoryCluster::get_pod(const kube::ObjectName& pod, kube::Deadline) const {
  return read("pods", pod.label());
}
ApiResponse InMemoryCluster::patch_pod(const kube::ObjectName& pod, const nlohmann::json& patch,
                                       kube::Deadline) const {
  return merge("pods", pod.label(), patch);
}

ApiResponse InMemoryCluster::bind_pod(const kube::ObjectName& pod, const std::string& uid,
                                      const std::string& node, kube::Deadline) const {
  base::MutexLock locked(mutex_);
  if (write_status_ != 200) return refusal(write_status_);
  auto found = objects_["pods"].find(pod.label());
  if (found == objects_["pods"].end()) return refusal(404);
  nlohmann::json& object = found->second;
  if (object["spec"].contains("nodeName") || object["metadata"].value("uid", "") != uid) {
    return refusal(409);
  }
  object["spec"]["nodeName"] = node;
  stamp(object);
  record("pods", "MODIFIED", object);
  return answer(201, {{"kind", "Binding"}, {"target", {{"name", node}}}});
}

ApiResponse InMemoryCluster::list(const kube::Collection& collection, kube::Deadline) const {
  base::MutexLock locked(mutex_);
  nlohmann::json items = nlohmann::json::array();
  for (const auto& [key, object] : objects_[kind_of(collection)]) {
    if (selected(collection, object)) items.push_back(object);
  }
  return answer(200, {{"kind", "List"},
                      {"metadata", {{"resourceVersion", std::to_string(version_)}}},
                      {"items", items}});
}

std::vector<std::string> InMemoryCluster::events_after(const kube::Collection& collection,
                                                       std::uint64_t& next,
                                                       std::chrono::milliseconds wait) const {
  const std::string kind = kind_of(collection);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  base::MutexLock locked(mutex_);
  while (events_.empty() || events_.back().version <= next) {
    if (!changed_.wait_until(mutex_, deadline)) break;
  }
  std::vector<std::string> lines;
  for (const Event& event : events_) {
    if (event.version <= next) continue;
    next = event.version;
    if (event.kind == kind && selected(collection, event.object)) {
      lines.push_back(nlohmann::json{{"type", event.type}, {"object", event.object}}.dump());
    }
  }
  return lines;
}

ApiResponse InMemoryCluster::watch(const kube::Collection& collection, const std::string& version,
                                   const std::function<bool(const std::string&)>& on_event,
                                   const std::atomic<bool>& stop, int) const {
  std::uint64_t next = 0;
  try {
    next = version.empty() ? 0 : std::stoull(version);
  } catch (const std::exception&) {
    return refusal(400);
  }
  while (!stop) {
    // `stop` is the caller's flag, set without a word to this cluster: looked at again every
    // 50 ms. The lines are handed over without the lock, since a handler may call back.
    for (const std::string& line : events_after(collection, next, std::chrono::milliseconds(50))) {
      if (!on_event(line)) return {200, {}, {}};
    }
  }
  return {200, {}, {}};
}

ApiResponse InMemoryCluster::get_lease(const kube::ObjectName& lease, kube::Deadline) const {
  return read("leases", lease.label());
}

ApiResponse InMemoryCluster::create(const std::string& kind, const std::string& key,
                                    const nlohmann::json& object) const {
  base::MutexLock locked(mutex_);
  if (write_status_ != 200) return refusal(write_status_);
  if (objects_[kind].count(key) > 0) return refusal(409);
  nlohmann::json created = object;
  stamp(created);
  objects_[kind][key] = created;
  record(kind, "ADDED", created);
  return answer(201, created);
}

ApiResponse InMemoryCluster::replace(const std::string& kind, const std::string& key,
                                     const nlohmann::json& object) const {
  base::MutexLock locked(mutex_);
  if (write_status_ != 200) return refusal(write_status_);
  auto found = objects_[kind].find(key);
  if (found == objects_[kind].end()) return refusal(404);
  nlohmann::json replaced = object;
  if (replaced["metadata"].contains("resourceVersion") &&
      replaced["metadata"]["resourceVersion"] != found->second["metadata"]["resourceVersion"]) {
    return refusal(409);
  }
  stamp(replaced);
  found->second = replaced;
  record(kind, "MODIFIED", replaced);
  return answer(200, replaced);
}

ApiResponse InMemoryCluster::create_lease(const kube::ObjectName& lease,
                                          const nlohmann::json& object, kube::Deadline) const {
  if (!object.is_object() || !object.contains("metadata")) return refusal(400);
  nlohmann::json created = object;
  created["metadata"]["namespace"] = lease.name_space;
  created["metadata"]["name"] = lease.name;
  return create("leases", lease.label(), created);
}

ApiResponse InMemoryCluster::replace_lease(const kube::ObjectName& lease,
                                           const nlohmann::json& object, kube::Deadline) const {
  if (!object.is_object() || !object.contains("metadata")) return refusal(400);
  return replace("leases", lease.label(), object);
}

ApiResponse InMemoryCluster::get_resource_claim(const kube::ObjectName& claim,
                                                kube::Deadline) const {
  return read("resourceclaims", claim.label());
}

ApiResponse InMemoryCluster::list_resource_slices(const std::string& driver,
                                                  const std::string& node, kube::Deadline) const {
  base::MutexLock locked(mutex_);
  nlohmann::json items = nlohmann::json::array();
  for (const auto& [key, object] : objects_["resourceslices"]) {
    if (object["spec"].value("driver", "") == driver &&
        object["spec"].value("nodeName", "") == node) {
      items.push_back(object);
    }
  }
  return answer(200, {{"kind", "ResourceSliceList"},
                      {"metadata", {{"resourceVersion", std::to_string(version_)}}},
                      {"items", items}});
}

ApiResponse InMemoryCluster::create_resource_slice(const nlohmann::json& object,
                                                   kube::Deadline) const {
  if (!object.is_object() || !object.contains("metadata") || !object["metadata"].contains("name") ||
      !object["metadata"]["name"].is_string()) {
    return refusal(400);
  }
  return create("resourceslices", object["metadata"]["name"].get<std::string>(), object);
}

ApiResponse InMemoryCluster::replace_resource_slice(const std::string& name,
                                                    const nlohmann::json& object,
                                                    kube::Deadline) const {
  if (!object.is_object() || !object.contains("metadata")) return refusal(400);
  return replace("resourceslices", name, object);
}

ApiResponse InMemoryCluster::delete_resource_slice(const std::string& name, kube::Deadline) const {
  base::MutexLock locked(mutex_);
  if (write_status_ != 200) return refusal(write_status_);
  if (!erase("resourceslices", name)) return refusal(404);
  return answer(200, {{"kind", "Status"}, {"status", "Success"}});
}

}  // namespace tessera::test
