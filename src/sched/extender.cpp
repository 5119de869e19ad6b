#include "sched/extender.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <thread>

namespace tessera::sched {
namespace {

HttpReply bad_request(const std::string& reason) {
  return {400, nlohmann::json{{"Error", reason}}.dump()};
}

// Go's JSON decoding matches field names case-insensitively; so does this.
const nlohmann::json* field(const nlohmann::json& object, const std::string& name) {
  if (!object.is_object()) return nullptr;
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it.key().size() == name.size() &&
        std::equal(name.begin(), name.end(), it.key().begin(),
                   [](char a, char b) { return std::tolower(a) == std::tolower(b); })) {
      return &it.value();
    }
  }
  return nullptr;
}

}  // namespace

Extender::Extender(Policy default_policy, std::unique_ptr<ApiClient> api)
    : default_policy_(default_policy), api_(std::move(api)) {}

Policy Extender::policy_for(const kube::PodRequest& pod) const {
  if (pod.policy.empty()) return default_policy_;
  try {
    return parse_policy(pod.policy);
  } catch (const std::invalid_argument&) {
    return default_policy_;
  }
}

void Extender::rebuild_locked() {
  if (!dirty_) return;
  std::vector<NodeSpec> specs;
  index_.clear();
  for (const auto& [name, info] : nodes_) {
    index_[name] = static_cast<int>(specs.size());
    specs.push_back(info.spec);
  }
  cluster_ = std::make_unique<Cluster>(specs);
  for (const auto& [uid, assignment] : assignments_) {
    const auto found = index_.find(assignment.node);
    if (found == index_.end()) continue;  // its node is gone
    const Request request =
        kube::request_on(*cluster_, assignment.pod, nodes_[assignment.node].gpu_memory_mib);
    Placement placement;
    placement.node = found->second;
    for (int gpu : assignment.gpus) {
      if (gpu >= 0 && gpu < nodes_[assignment.node].spec.gpus)
        placement.gpu_index[placement.gpu_count++] = gpu;
    }
    cluster_->allocate(request, placement);
  }
  dirty_ = false;
}

bool Extender::parse_args(const std::string& body, Candidates& candidates, HttpReply& reply) {
  nlohmann::json args;
  try {
    args = nlohmann::json::parse(body);
  } catch (const std::exception& error) {
    reply = bad_request(fmt::format("the body is not JSON: {}", error.what()));
    return false;
  }
  const nlohmann::json* pod = field(args, "Pod");
  if (pod == nullptr || !pod->is_object()) {
    reply = bad_request("ExtenderArgs has no Pod object");
    return false;
  }
  try {
    candidates.pod = kube::pod_from_json(*pod);
  } catch (const std::exception& error) {
    reply = bad_request(error.what());
    return false;
  }
  const nlohmann::json* nodes = field(args, "Nodes");
  const nlohmann::json* names = field(args, "NodeNames");
  if (nodes != nullptr && !nodes->is_null()) {
    const nlohmann::json* items = field(*nodes, "items");
    if (items == nullptr || !items->is_array()) {
      reply = bad_request("ExtenderArgs.Nodes has no items array");
      return false;
    }
    for (const auto& node : *items) {
      try {
        kube::NodeInfo info = kube::node_from_json(node);
        candidates.names.push_back(info.spec.name);
        candidates.node_objects.push_back(node);
        std::lock_guard<std::mutex> locked(mutex_);
        auto& known = nodes_[info.spec.name];
        if (known.spec.cpu_milli != info.spec.cpu_milli || known.spec.gpus != info.spec.gpus ||
            known.spec.model != info.spec.model || known.spec.memory_mib != info.spec.memory_mib) {
          known = info;
          dirty_ = true;
        }
      } catch (const std::exception& error) {
        reply = bad_request(error.what());
        return false;
      }
    }
  } else if (names != nullptr && names->is_array()) {
    for (const auto& name : *names) {
      if (!name.is_string()) {
        reply = bad_request("ExtenderArgs.NodeNames holds a non-string");
        return false;
      }
      candidates.names.push_back(name.get<std::string>());
    }
    candidates.names_only = true;
  } else {
    reply = bad_request("ExtenderArgs has neither Nodes nor NodeNames");
    return false;
  }
  return true;
}

std::string Extender::refusal_locked(const kube::PodRequest& pod, const std::string& node,
                                     Request& request, int& index) {
  const auto found = index_.find(node);
  if (found == index_.end()) return "node unknown to Tessera";
  index = found->second;
  const kube::NodeInfo& info = nodes_[node];
  if (pod.gpus > 0) {
    if (info.spec.gpus == 0)
      return fmt::format("node has no GPUs Tessera knows of ({})", kube::kGpusAnnotation);
    if (std::string why = kube::model_refusal(pod, info.spec.model); !why.empty()) return why;
  }
  request = kube::request_on(*cluster_, pod, info.gpu_memory_mib);
  if (request.gpu_milli > kMilli) {
    return fmt::format("asks for {} MiB of GPU memory; a GPU here has {} MiB", pod.gpumem_mib,
                       info.gpu_memory_mib);
  }
  if (!cluster_->fits(cluster_->nodes()[index], request)) {
    if (pod.gpus == 0) return "not enough CPU or memory";
    return fmt::format("no room for {} GPU(s) of {} milli-GPU (or for the CPU and memory)",
                       request.gpus, request.gpu_milli);
  }
  return {};
}

HttpReply Extender::filter(const std::string& body) {
  Candidates candidates;
  HttpReply reply;
  if (!parse_args(body, candidates, reply)) return reply;
  nlohmann::json failed = nlohmann::json::object();
  nlohmann::json passed_names = nlohmann::json::array();
  nlohmann::json passed_nodes = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> locked(mutex_);
    rebuild_locked();
    for (std::size_t i = 0; i < candidates.names.size(); ++i) {
      Request request;
      int index = -1;
      const std::string why = refusal_locked(candidates.pod, candidates.names[i], request, index);
      if (!why.empty()) {
        failed[candidates.names[i]] = why;
        continue;
      }
      passed_names.push_back(candidates.names[i]);
      if (!candidates.names_only) passed_nodes.push_back(candidates.node_objects[i]);
    }
    if (!candidates.pod.uid.empty()) seen_[candidates.pod.uid] = candidates.pod;
  }
  nlohmann::json result{{"FailedNodes", failed},
                        {"FailedAndUnresolvableNodes", nlohmann::json::object()},
                        {"Error", ""}};
  if (candidates.names_only) {
    result["NodeNames"] = passed_names;
    result["Nodes"] = nullptr;
  } else {
    result["Nodes"] = {{"items", passed_nodes}};
    result["NodeNames"] = nullptr;
  }
  return {200, result.dump()};
}

HttpReply Extender::prioritize(const std::string& body) {
  Candidates candidates;
  HttpReply reply;
  if (!parse_args(body, candidates, reply)) return reply;
  std::vector<std::pair<std::string, double>> scores;
  {
    std::lock_guard<std::mutex> locked(mutex_);
    rebuild_locked();
    const Policy policy = policy_for(candidates.pod);
    for (const std::string& name : candidates.names) {
      Request request;
      int index = -1;
      double score = 0;
      if (refusal_locked(candidates.pod, name, request, index).empty() &&
          cluster_->score_on(index, request, policy, score)) {
        scores.emplace_back(name, score);
      } else {
        scores.emplace_back(name, -1e300);
      }
    }
  }
  // Scaled to kube-scheduler's 0..10 across the candidates; nodes that do not fit get 0.
  double low = 1e300, high = -1e300;
  for (const auto& [name, score] : scores) {
    if (score <= -1e300) continue;
    low = std::min(low, score);
    high = std::max(high, score);
  }
  nlohmann::json result = nlohmann::json::array();
  for (const auto& [name, score] : scores) {
    long scaled = 0;
    if (score > -1e300) scaled = high > low ? std::lround(10 * (score - low) / (high - low)) : 5;
    result.push_back({{"Host", name}, {"Score", scaled}});
  }
  return {200, result.dump()};
}

HttpReply Extender::bind(const std::string& body) {
  nlohmann::json args;
  try {
    args = nlohmann::json::parse(body);
  } catch (const std::exception& error) {
    return bad_request(fmt::format("the body is not JSON: {}", error.what()));
  }
  const nlohmann::json* name = field(args, "PodName");
  const nlohmann::json* ns = field(args, "PodNamespace");
  const nlohmann::json* uid = field(args, "PodUID");
  const nlohmann::json* node = field(args, "Node");
  for (const auto& [value, what] : {std::pair{name, "PodName"}, std::pair{ns, "PodNamespace"},
                                    std::pair{uid, "PodUID"}, std::pair{node, "Node"}}) {
    if (value == nullptr || !value->is_string() || value->get<std::string>().empty()) {
      return bad_request(fmt::format("ExtenderBindingArgs.{} is missing or not a string", what));
    }
  }
  const std::string pod_name = name->get<std::string>(), pod_ns = ns->get<std::string>();
  const std::string pod_uid = uid->get<std::string>(), node_name = node->get<std::string>();
  auto error = [](const std::string& reason) {
    return HttpReply{200, nlohmann::json{{"Error", reason}}.dump()};
  };

  kube::PodRequest pod;
  bool known = false;
  {
    std::lock_guard<std::mutex> locked(mutex_);
    if (const auto found = seen_.find(pod_uid); found != seen_.end()) {
      pod = found->second;
      known = true;
    }
  }
  if (!known) {  // not filtered by this replica: ask the API server
    const ApiResponse response =
        api_->get(fmt::format("/api/v1/namespaces/{}/pods/{}", pod_ns, pod_name));
    if (response.status != 200) {
      return error(fmt::format("cannot read pod {}/{}: HTTP {} {}", pod_ns, pod_name,
                               response.status, response.error));
    }
    try {
      pod = kube::pod_from_json(nlohmann::json::parse(response.body));
    } catch (const std::exception& failure) {
      return error(failure.what());
    }
  }

  Assignment assignment{node_name, pod, {}};
  {
    std::lock_guard<std::mutex> locked(mutex_);
    rebuild_locked();
    Request request;
    int index = -1;
    if (std::string why = refusal_locked(pod, node_name, request, index); !why.empty()) {
      return error(
          fmt::format("pod {}/{} no longer fits node {}: {}", pod_ns, pod_name, node_name, why));
    }
    const Placement placement = cluster_->place_on(index, request, policy_for(pod), random_);
    for (int k = 0; k < placement.gpu_count; ++k) assignment.gpus.push_back(placement.gpu_index[k]);
    // Held now, so that concurrent binds cannot take the same room.
    cluster_->allocate(request, placement);
    assignments_[pod_uid] = assignment;
    own_binds_[pod_uid] = std::chrono::steady_clock::now();
    seen_.erase(pod_uid);
  }
  const Request summary = [&] {
    std::lock_guard<std::mutex> locked(mutex_);
    return kube::request_on(*cluster_, pod, nodes_[node_name].gpu_memory_mib);
  }();
  const nlohmann::json record{
      {"node", node_name}, {"gpus", assignment.gpus}, {"milli", summary.gpu_milli}};
  const nlohmann::json patch{
      {"metadata", {{"annotations", {{kube::kAssignmentAnnotation, record.dump()}}}}}};
  const nlohmann::json binding{
      {"apiVersion", "v1"},
      {"kind", "Binding"},
      {"metadata", {{"name", pod_name}, {"namespace", pod_ns}, {"uid", pod_uid}}},
      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node_name}}}};
  const std::string pod_path = fmt::format("/api/v1/namespaces/{}/pods/{}", pod_ns, pod_name);
  ApiResponse response = api_->patch(pod_path, patch.dump());
  if (response.status == 200) response = api_->post(pod_path + "/binding", binding.dump());
  if (response.status != 200 && response.status != 201) {
    std::lock_guard<std::mutex> locked(mutex_);
    assignments_.erase(pod_uid);  // give the room back
    own_binds_.erase(pod_uid);
    dirty_ = true;
    return error(fmt::format("binding {}/{} to {} failed: HTTP {} {}", pod_ns, pod_name, node_name,
                             response.status,
                             response.status == 0 ? response.error : response.body));
  }
  return {200, nlohmann::json{{"Error", ""}}.dump()};
}

namespace {

// A pod's assignment as recorded on it, unless it has none or has finished (its resources are
// free again).
std::optional<std::pair<std::string, std::vector<int>>> recorded_assignment(
    const nlohmann::json& pod) {
  const std::string phase = pod.value("/status/phase"_json_pointer, std::string());
  if (phase == "Succeeded" || phase == "Failed") return std::nullopt;
  const auto annotations =
      pod.value("/metadata/annotations"_json_pointer, nlohmann::json::object());
  if (!annotations.contains(kube::kAssignmentAnnotation)) return std::nullopt;
  const auto record =
      nlohmann::json::parse(annotations[kube::kAssignmentAnnotation].get<std::string>());
  return std::pair{record.at("node").get<std::string>(), record.at("gpus").get<std::vector<int>>()};
}

const char* collection_path(Extender::Resource resource) {
  return resource == Extender::Resource::nodes ? "/api/v1/nodes" : "/api/v1/pods";
}

}  // namespace

bool Extender::list(Resource resource, std::string& version, std::string& error) {
  const ApiResponse listed = api_->get(collection_path(resource));
  if (listed.status != 200) {
    error = fmt::format("listing {} failed: HTTP {} {}", collection_path(resource), listed.status,
                        listed.error);
    return false;
  }
  std::map<std::string, kube::NodeInfo> node_infos;
  std::map<std::string, Assignment> assignments;
  try {
    const nlohmann::json list_body = nlohmann::json::parse(listed.body);
    version = list_body.value("/metadata/resourceVersion"_json_pointer, std::string());
    for (const auto& item : list_body.at("items")) {
      if (resource == Resource::nodes) {
        kube::NodeInfo info = kube::node_from_json(item);
        node_infos[info.spec.name] = info;
      } else if (auto recorded = recorded_assignment(item)) {
        Assignment assignment{recorded->first, kube::pod_from_json(item), recorded->second};
        assignments[assignment.pod.uid] = assignment;
      }
    }
  } catch (const std::exception& failure) {
    error = fmt::format("the API server's list of {} is malformed: {}", collection_path(resource),
                        failure.what());
    return false;
  }
  std::lock_guard<std::mutex> locked(mutex_);
  if (resource == Resource::nodes) {
    nodes_ = std::move(node_infos);
  } else {
    // A list may have been read before this extender's latest binds reached the API server:
    // those stay held a while, unless the list shows them already.
    const auto now = std::chrono::steady_clock::now();
    for (auto bound = own_binds_.begin(); bound != own_binds_.end();) {
      const auto held = assignments_.find(bound->first);
      if (now - bound->second > kOwnBindGrace || held == assignments_.end()) {
        bound = own_binds_.erase(bound);
        continue;
      }
      assignments.try_emplace(bound->first, held->second);
      ++bound;
    }
    assignments_ = std::move(assignments);
  }
  dirty_ = true;
  return true;
}

bool Extender::sync(std::string& error) {
  std::string version;
  return list(Resource::nodes, version, error) && list(Resource::pods, version, error);
}

Extender::WatchEnd Extender::apply_event(Resource resource, const std::string& line,
                                         std::string& version, std::string& why) {
  nlohmann::json event;
  try {
    event = nlohmann::json::parse(line);
  } catch (const std::exception& error) {
    why = fmt::format("an event is not JSON: {}", error.what());
    return WatchEnd::broken;
  }
  const std::string type = event.value("type", std::string());
  const nlohmann::json& object = event.contains("object") ? event["object"] : event;
  if (type == "ERROR" || type.empty()) {  // 410 Gone: the version is too old to watch from
    if (object.value("code", 0) == 410) return WatchEnd::expired;
    why = fmt::format("the API server sent {}", line.substr(0, 200));
    return WatchEnd::broken;
  }
  version = object.value("/metadata/resourceVersion"_json_pointer, version);
  if (type == "BOOKMARK") return WatchEnd::not_yet;
  try {
    std::lock_guard<std::mutex> locked(mutex_);
    if (resource == Resource::nodes) {
      kube::NodeInfo info = kube::node_from_json(object);
      if (type == "DELETED") {
        nodes_.erase(info.spec.name);
      } else {
        nodes_[info.spec.name] = info;
      }
    } else {
      const kube::PodRequest pod = kube::pod_from_json(object);
      const auto recorded = type == "DELETED" ? std::nullopt : recorded_assignment(object);
      if (recorded) {
        assignments_[pod.uid] = Assignment{recorded->first, pod, recorded->second};
      } else if (type == "DELETED" ||
                 object.value("/status/phase"_json_pointer, std::string()) == "Succeeded" ||
                 object.value("/status/phase"_json_pointer, std::string()) == "Failed") {
        assignments_.erase(pod.uid);
      }  // else not placed by Tessera yet: a bind of ours may be holding its room
    }
    dirty_ = true;
  } catch (const std::exception& error) {  // list again rather than guess
    why = fmt::format("a {} event's object cannot be read: {}", type, error.what());
    return WatchEnd::broken;
  }
  return WatchEnd::not_yet;
}

void Extender::follow(Resource resource, const std::atomic<bool>& stop,
                      const std::function<void(const std::string&)>& report) {
  auto pause = [&stop] {  // a second, unless stopped
    for (int waited = 0; waited < 10 && !stop; ++waited) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  };
  while (!stop) {
    std::string version, error;
    if (!list(resource, version, error)) {
      report(error);
      pause();
      continue;
    }
    WatchEnd end = WatchEnd::not_yet;
    while (!stop && end == WatchEnd::not_yet) {
      const std::string path =
          fmt::format("{}?watch=1&allowWatchBookmarks=true&timeoutSeconds=300&resourceVersion={}",
                      collection_path(resource), version);
      const ApiResponse answer = api_->watch(
          path,
          [&](const std::string& line) {
            end = apply_event(resource, line, version, error);
            return end == WatchEnd::not_yet;
          },
          stop, 330);
      if (end == WatchEnd::not_yet && answer.status != 200 && !stop) {
        error = fmt::format("HTTP {} {}", answer.status, answer.error);
        end = WatchEnd::broken;
      }
      if (end == WatchEnd::broken) {  // whatever broke it, say so, and do not hammer the server
        report(fmt::format("watching {}: {}; listing again", collection_path(resource), error));
        pause();
      }
      // A stream that ends cleanly (timeoutSeconds) is resumed from the last version seen.
    }
  }
}

}  // namespace tessera::sched
