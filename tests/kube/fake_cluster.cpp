#include "fake_cluster.h"

#include <memory>

#include "kube/json_input.h"

namespace tessera::test {
namespace {

constexpr kube::Deadline kNoDeadline = kube::Deadline::max();

void reply(httplib::Response& response, const kube::ApiResponse& answer) {
  response.status = static_cast<int>(answer.status == 0 ? 503 : answer.status);
  response.set_content(answer.body, "application/json");
}

// A body that is not JSON is refused as the API server refuses it; nullopt then.
std::optional<nlohmann::json> body_of(const httplib::Request& request,
                                      httplib::Response& response) {
  nlohmann::json body = nlohmann::json::parse(request.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    response.status = 400;
    response.set_content(R"({"kind":"Status","code":400})", "application/json");
    return std::nullopt;
  }
  return body;
}

kube::ObjectName object_name(const httplib::Request& request) {
  return {request.matches[1].str(), request.matches[2].str()};
}

}  // namespace

FakeCluster::FakeCluster() {
  server_.Get("/api/v1/nodes",
              [this](const httplib::Request& request, httplib::Response& response) {
                serve_collection(kube::Collection::Kind::nodes, request, response);
              });
  server_.Get("/api/v1/pods", [this](const httplib::Request& request, httplib::Response& response) {
    serve_collection(kube::Collection::Kind::pods, request, response);
  });
  server_.Get(R"(/api/v1/nodes/([^/]+))",
              [this](const httplib::Request& request, httplib::Response& response) {
                reply(response, get_node(request.matches[1].str(), kNoDeadline));
              });
  server_.Patch(R"(/api/v1/nodes/([^/]+))",
                [this](const httplib::Request& request, httplib::Response& response) {
                  if (const auto patch = body_of(request, response)) {
                    reply(response, patch_node(request.matches[1].str(), *patch, kNoDeadline));
                  }
                });
  const std::string pod = R"(/api/v1/namespaces/([^/]+)/pods/([^/]+))";
  server_.Get(pod, [this](const httplib::Request& request, httplib::Response& response) {
    reply(response, get_pod(object_name(request), kNoDeadline));
  });
  server_.Patch(pod, [this](const httplib::Request& request, httplib::Response& response) {
    if (const auto patch = body_of(request, response)) {
      reply(response, patch_pod(object_name(request), *patch, kNoDeadline));
    }
  });
  server_.Post(pod + "/binding", [this](const httplib::Request& request,
                                        httplib::Response& response) {
    if (const auto binding = body_of(request, response)) {
      reply(response,
            bind_pod(object_name(request), kube::string_at(*binding, "/metadata/uid"_json_pointer),
                     kube::string_at(*binding, "/target/name"_json_pointer), kNoDeadline));
    }
  });
  serve_leases();
  serve_resources();
  port_ = server_.bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { server_.listen_after_bind(); });
}

void FakeCluster::serve_leases() {
  const std::string leases = R"(/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases)";
  server_.Get(leases + "/([^/]+)",
              [this](const httplib::Request& request, httplib::Response& response) {
                reply(response, get_lease(object_name(request), kNoDeadline));
              });
  server_.Post(leases, [this](const httplib::Request& request, httplib::Response& response) {
    if (const auto lease = body_of(request, response)) {
      reply(response, create_lease({request.matches[1].str(),
                                    kube::string_at(*lease, "/metadata/name"_json_pointer)},
                                   *lease, kNoDeadline));
    }
  });
  server_.Put(leases + "/([^/]+)",
              [this](const httplib::Request& request, httplib::Response& response) {
                if (const auto lease = body_of(request, response)) {
                  reply(response, replace_lease(object_name(request), *lease, kNoDeadline));
                }
              });
}

void FakeCluster::serve_resources() {
  const std::string api = "/apis/resource.k8s.io/v1";
  server_.Get(api + "/resourceslices",
              [this](const httplib::Request& request, httplib::Response& response) {
                // "spec.driver=<driver>,spec.nodeName=<node>", as the node agent asks.
                std::string driver, node;
                const std::string selector = request.get_param_value("fieldSelector");
                for (std::size_t at = 0; at <= selector.size();) {
                  const std::size_t end = std::min(selector.find(',', at), selector.size());
                  const std::string term = selector.substr(at, end - at);
                  if (term.starts_with("spec.driver=")) driver = term.substr(12);
                  if (term.starts_with("spec.nodeName=")) node = term.substr(14);
                  at = end + 1;
                }
                reply(response, list_resource_slices(driver, node, kNoDeadline));
              });
  server_.Post(api + "/resourceslices",
               [this](const httplib::Request& request, httplib::Response& response) {
                 if (const auto slice = body_of(request, response)) {
                   reply(response, create_resource_slice(*slice, kNoDeadline));
                 }
               });
  server_.Put(api + "/resourceslices/([^/]+)", [this](const httplib::Request& request,
                                                      httplib::Response& response) {
    if (const auto slice = body_of(request, response)) {
      reply(response, replace_resource_slice(request.matches[1].str(), *slice, kNoDeadline));
    }
  });
  server_.Delete(api + "/resourceslices/([^/]+)",
                 [this](const httplib::Request& request, httplib::Response& response) {
                   reply(response, delete_resource_slice(request.matches[1].str(), kNoDeadline));
                 });
  server_.Get(api + "/namespaces/([^/]+)/resourceclaims/([^/]+)",
              [this](const httplib::Request& request, httplib::Response& response) {
                reply(response, get_resource_claim(object_name(request), kNoDeadline));
              });
  server_.Get(api + "/deviceclasses/([^/]+)", [this](const httplib::Request& request,
                                                     httplib::Response& response) {
    const auto found = get("deviceclasses", request.matches[1].str());
    reply(response, found ? kube::ApiResponse{200, found->dump(), {}}
                          : kube::ApiResponse{404, R"({"kind":"Status","code":404})", {}});
  });
}

FakeCluster::~FakeCluster() {
  stopping_ = true;
  server_.stop();
  thread_.join();
}

void FakeCluster::serve_collection(kube::Collection::Kind kind, const httplib::Request& request,
                                   httplib::Response& response) {
  // The one field selector each collection is asked with: a node by name, pods by node.
  kube::Collection collection{kind, {}};
  const std::string field =
      kind == kube::Collection::Kind::nodes ? "metadata.name=" : "spec.nodeName=";
  if (const std::string selector = request.get_param_value("fieldSelector");
      selector.starts_with(field)) {
    collection.node = selector.substr(field.size());
  }
  if (!request.has_param("watch")) {
    reply(response, list(collection, kNoDeadline));
    return;
  }
  auto next = std::make_shared<std::uint64_t>(0);
  try {
    const std::string version = request.get_param_value("resourceVersion");
    *next = version.empty() ? 0 : std::stoull(version);
  } catch (const std::exception&) {
    response.status = 400;
    return;
  }
  response.set_chunked_content_provider(
      "application/json", [this, collection, next](std::size_t, httplib::DataSink& sink) {
        // Back every 100 ms at most, so that the server sees a client gone and its stopping.
        for (const std::string& line :
             events_after(collection, *next, std::chrono::milliseconds(100))) {
          const std::string event = line + "\n";
          if (!sink.write(event.data(), event.size())) return false;
        }
        return !stopping_.load();
      });
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
