#include "fake_cluster.h"

#include <chrono>

namespace tessera::test {
namespace {

// The value a fieldSelector gives for `field` ("metadata.name=x,spec.nodeName=y").
std::map<std::string, std::string> selectors(const httplib::Request& request) {
  std::map<std::string, std::string> fields;
  if (!request.has_param("fieldSelector")) return fields;
  const std::string text = request.get_param_value("fieldSelector");
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string term = text.substr(start, comma - start);
    const std::size_t equals = term.find('=');
    if (equals != std::string::npos) fields[term.substr(0, equals)] = term.substr(equals + 1);
    start = comma + 1;
  }
  return fields;
}

bool selected(const nlohmann::json& object, const std::map<std::string, std::string>& fields) {
  for (const auto& [field, value] : fields) {
    std::string pointer = "/" + field;
    for (char& c : pointer) c = c == '.' ? '/' : c;
    const nlohmann::json::json_pointer at(pointer);
    const std::string actual =
        object.contains(at) && object[at].is_string() ? object[at].get<std::string>() : "";
    if (actual != value) return false;
  }
  return true;
}

}  // namespace

std::string FakeCluster::key_of(const std::string& kind, const nlohmann::json& object) {
  const std::string name = object["metadata"]["name"].get<std::string>();
  if (kind == "nodes") return name;
  return object["metadata"].value("namespace", std::string("default")) + "/" + name;
}

FakeCluster::FakeCluster() {
  for (const std::string kind : {"nodes", "pods"}) {
    server_.Get("/api/v1/" + kind,
                [this, kind](const httplib::Request& request, httplib::Response& response) {
                  serve_collection(kind, request, response);
                });
  }
  server_.Get(R"(/api/v1/nodes/([^/]+))",
              [this](const httplib::Request& request, httplib::Response& response) {
                const auto found = get("nodes", request.matches[1].str());
                {
                  std::lock_guard<std::mutex> locked(mutex_);
                  requests_.push_back("GET " + request.path);
                }
                if (!found) {
                  response.status = 404;
                  response.set_content(R"({"kind":"Status","code":404})", "application/json");
                  return;
                }
                response.set_content(found->dump(), "application/json");
              });
  server_.Get(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+))", [this](const httplib::Request& request,
                                                                   httplib::Response& response) {
    const auto found = get("pods", request.matches[1].str() + "/" + request.matches[2].str());
    if (!found) {
      response.status = 404;
      response.set_content(R"({"kind":"Status","code":404})", "application/json");
      return;
    }
    response.set_content(found->dump(), "application/json");
  });
  server_.Patch(R"(/api/v1/nodes/([^/]+))",
                [this](const httplib::Request& request, httplib::Response& response) {
                  serve_patch("nodes", request.matches[1].str(), request, response);
                });
  server_.Patch(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+))",
                [this](const httplib::Request& request, httplib::Response& response) {
                  serve_patch("pods", request.matches[1].str() + "/" + request.matches[2].str(),
                              request, response);
                });
  server_.Post(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding)",
               [this](const httplib::Request& request, httplib::Response& response) {
                 const std::string key = request.matches[1].str() + "/" + request.matches[2].str();
                 const nlohmann::json binding = nlohmann::json::parse(request.body);
                 std::lock_guard<std::mutex> locked(mutex_);
                 requests_.push_back("POST " + request.path);
                 auto found = objects_["pods"].find(key);
                 if (found == objects_["pods"].end()) {
                   response.status = 404;
                   return;
                 }
                 if (found->second["spec"].contains("nodeName")) {
                   response.status = 409;
                   response.set_content(R"({"kind":"Status","code":409,"reason":"Conflict"})",
                                        "application/json");
                   return;
                 }
                 found->second["spec"]["nodeName"] = binding["target"]["name"];
                 stamp(found->second);
                 record("pods", "MODIFIED", found->second);
                 response.status = 201;
                 response.set_content(binding.dump(), "application/json");
               });
  serve_leases();
  port_ = server_.bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { server_.listen_after_bind(); });
}

// Leases as the API server keeps them: create refused (409) when one exists, replace refused
// (409) when it names a version that is not the Lease's.
void FakeCluster::serve_leases() {
  const std::string base = R"(/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases)";
  auto refuse = [](httplib::Response& response, int status) {
    response.status = status;
    response.set_content(nlohmann::json{{"kind", "Status"}, {"code", status}}.dump(),
                         "application/json");
  };
  server_.Get(base + "/([^/]+)", [this, refuse](const httplib::Request& request,
                                                httplib::Response& response) {
    const auto found = get("leases", request.matches[1].str() + "/" + request.matches[2].str());
    if (!found) return refuse(response, 404);
    response.set_content(found->dump(), "application/json");
  });
  server_.Post(base, [this, refuse](const httplib::Request& request, httplib::Response& response) {
    nlohmann::json lease = nlohmann::json::parse(request.body, nullptr, false);
    if (!lease.is_object() || !lease.contains("metadata")) return refuse(response, 400);
    lease["metadata"]["namespace"] = request.matches[1].str();
    std::lock_guard<std::mutex> locked(mutex_);
    requests_.push_back("POST " + request.path);
    const std::string key = key_of("leases", lease);
    if (objects_["leases"].count(key) > 0) return refuse(response, 409);
    stamp(lease);
    objects_["leases"][key] = lease;
    record("leases", "ADDED", lease);
    response.status = 201;
    response.set_content(lease.dump(), "application/json");
  });
  server_.Put(base + "/([^/]+)", [this, refuse](const httplib::Request& request,
                                                httplib::Response& response) {
    nlohmann::json lease = nlohmann::json::parse(request.body, nullptr, false);
    if (!lease.is_object() || !lease.contains("metadata")) return refuse(response, 400);
    std::lock_guard<std::mutex> locked(mutex_);
    requests_.push_back("PUT " + request.path);
    auto found = objects_["leases"].find(request.matches[1].str() + "/" + request.matches[2].str());
    if (found == objects_["leases"].end()) return refuse(response, 404);
    if (lease["metadata"].contains("resourceVersion") &&
        lease["metadata"]["resourceVersion"] != found->second["metadata"]["resourceVersion"]) {
      return refuse(response, 409);
    }
    stamp(lease);
    found->second = lease;
    record("leases", "MODIFIED", lease);
    response.set_content(lease.dump(), "application/json");
  });
}

FakeCluster::~FakeCluster() {
  stopping_ = true;
  changed_.notify_all();
  server_.stop();
  thread_.join();
}

void FakeCluster::stamp(nlohmann::json& object) {
  object["metadata"]["resourceVersion"] = std::to_string(++version_);
}

void FakeCluster::record(const std::string& kind, const std::string& type,
                         const nlohmann::json& object) {
  events_.push_back({version_, kind, type, object});
  changed_.notify_all();
}

void FakeCluster::put(const std::string& kind, nlohmann::json object) {
  std::lock_guard<std::mutex> locked(mutex_);
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

void FakeCluster::remove(const std::string& kind, const std::string& key) {
  std::lock_guard<std::mutex> locked(mutex_);
  auto found = objects_[kind].find(key);
  if (found == objects_[kind].end()) return;
  nlohmann::json object = found->second;
  objects_[kind].erase(found);
  stamp(object);
  record(kind, "DELETED", object);
}

void FakeCluster::patch(const std::string& kind, const std::string& key,
                        const nlohmann::json& patch) {
  std::lock_guard<std::mutex> locked(mutex_);
  nlohmann::json& object = objects_[kind].at(key);
  object.merge_patch(patch);
  stamp(object);
  record(kind, "MODIFIED", object);
}

std::optional<nlohmann::json> FakeCluster::get(const std::string& kind,
                                               const std::string& key) const {
  std::lock_guard<std::mutex> locked(mutex_);
  const auto collection = objects_.find(kind);
  if (collection == objects_.end()) return std::nullopt;
  const auto found = collection->second.find(key);
  if (found == collection->second.end()) return std::nullopt;
  return found->second;
}

bool FakeCluster::wait_for(const std::string& kind, const std::string& key,
                           const std::function<bool(const nlohmann::json&)>& ready,
                           std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> locked(mutex_);
  return changed_.wait_for(locked, timeout, [&] {
    const auto found = objects_[kind].find(key);
    return found != objects_[kind].end() && ready(found->second);
  });
}

std::vector<std::string> FakeCluster::requests() const {
  std::lock_guard<std::mutex> locked(mutex_);
  return requests_;
}

void FakeCluster::serve_collection(const std::string& kind, const httplib::Request& request,
                                   httplib::Response& response) {
  const auto fields = selectors(request);
  {
    std::lock_guard<std::mutex> locked(mutex_);
    requests_.push_back("GET " + request.path + (request.has_param("watch") ? "?watch" : ""));
  }
  if (!request.has_param("watch")) {
    std::lock_guard<std::mutex> locked(mutex_);
    nlohmann::json items = nlohmann::json::array();
    for (const auto& [key, object] : objects_[kind]) {
      if (selected(object, fields)) items.push_back(object);
    }
    response.set_content(
        nlohmann::json{{"kind", "List"},
                       {"metadata", {{"resourceVersion", std::to_string(version_)}}},
                       {"items", items}}
            .dump(),
        "application/json");
    return;
  }
  const std::uint64_t from = std::stoull(request.get_param_value("resourceVersion").empty()
                                             ? "0"
                                             : request.get_param_value("resourceVersion"));
  auto next = std::make_shared<std::uint64_t>(from);
  response.set_chunked_content_provider(
      "application/json", [this, kind, fields, next](std::size_t, httplib::DataSink& sink) {
        std::unique_lock<std::mutex> locked(mutex_);
        changed_.wait_for(locked, std::chrono::milliseconds(100), [&] {
          return stopping_.load() || (!events_.empty() && events_.back().version > *next);
        });
        for (const Event& event : events_) {
          if (event.version <= *next || event.kind != kind) continue;
          *next = event.version;
          if (!selected(event.object, fields)) continue;
          const std::string line =
              nlohmann::json{{"type", event.type}, {"object", event.object}}.dump() + "\n";
          if (!sink.write(line.data(), line.size())) return false;
        }
        if (!events_.empty()) *next = std::max(*next, events_.back().version);
        return !stopping_.load();
      });
}

void FakeCluster::serve_patch(const std::string& kind, const std::string& key,
                              const httplib::Request& request, httplib::Response& response) {
  nlohmann::json patch;
  try {
    patch = nlohmann::json::parse(request.body);
  } catch (const std::exception&) {
    response.status = 400;
    return;
  }
  std::lock_guard<std::mutex> locked(mutex_);
  requests_.push_back("PATCH " + request.path);
  auto found = objects_[kind].find(key);
  if (found == objects_[kind].end()) {
    response.status = 404;
    response.set_content(R"({"kind":"Status","code":404})", "application/json");
    return;
  }
  // A merge patch naming a version answers 409 unless it is the object's.
  if (patch.contains("metadata") && patch["metadata"].contains("resourceVersion") &&
      patch["metadata"]["resourceVersion"] != found->second["metadata"]["resourceVersion"]) {
    response.status = 409;
    response.set_content(R"({"kind":"Status","code":409,"reason":"Conflict"})", "application/json");
    return;
  }
  if (patch.contains("metadata")) patch["metadata"].erase("resourceVersion");
  found->second.merge_patch(patch);
  stamp(found->second);
  record(kind, "MODIFIED", found->second);
  response.set_content(found->second.dump(), "application/json");
}

nlohmann::json gpu_pod(const std::string& name, int gpus, int gpumem_mib, int gpucores,
                       const std::string& scheduler) {
  nlohmann::json limits{{"nvidia.com/gpu", gpus}};
  if (gpumem_mib > 0) limits["nvidia.com/gpumem"] = gpumem_mib;
  if (gpucores > 0) limits["nvidia.com/gpucores"] = gpucores;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec",
           {{"schedulerName", scheduler},
            {"containers",
             {{{"name", "main"},
               {"image", "nvidia/cuda:12.0-base"},
               {"resources",
                {{"limits", limits}, {"requests", {{"cpu", "1"}, {"memory", "1Gi"}}}}}}}}}},
          {"status", {{"phase", "Pending"}}}};
}

nlohmann::json cluster_node(const std::string& name, const std::string& cpu,
                            const std::string& memory) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata",
           {{"name", name},
            {"labels", nlohmann::json::object()},
            {"annotations", nlohmann::json::object()}}},
          {"status", {{"allocatable", {{"cpu", cpu}, {"memory", memory}, {"pods", "110"}}}}}};
}

}  // namespace tessera::test
