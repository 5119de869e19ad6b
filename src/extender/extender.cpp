#include "extender/extender.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>

#include "contract/api_paths.h"
#include "contract/pod_resources.h"
#include "kube/json_input.h"

namespace tessera::extender {

using kube::ApiClient;
using kube::ApiResponse;
using kube::dns_name;
using kube::dump_outside_json;
using kube::parse_outside_json;
using kube::string_at;

namespace {

using Clock = std::chrono::steady_clock;

HttpReply json_reply(int status, const nlohmann::json& value) {
  return {status, dump_outside_json(value)};
}

HttpReply bad_request(const std::string& reason) {
  return json_reply(400, nlohmann::json{{"Error", reason}});
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

std::string collection_path(Extender::Resource resource) {
  return resource == Extender::Resource::nodes ? contract::api::nodes() : contract::api::pods();
}

bool same_node(const NodeInfo& a, const NodeInfo& b) {
  return a.spec.cpu_milli == b.spec.cpu_milli && a.spec.memory_mib == b.spec.memory_mib &&
         a.spec.gpus == b.spec.gpus && a.spec.model == b.spec.model &&
         a.gpu_memory_mib == b.gpu_memory_mib && a.spec.whole_only_gpus == b.spec.whole_only_gpus &&
         a.gpu_uuids == b.gpu_uuids && a.spec.mig == b.spec.mig &&
         a.kubelet_counted_gpus == b.kubelet_counted_gpus;
}

}  // namespace

Extender::Extender(Policy default_policy, std::unique_ptr<ApiClient> api, Reporter report,
                   ExtenderLimits limits)
    : default_policy_(default_policy),
      api_(std::move(api)),
      report_(std::move(report)),
      limits_(limits),
      cluster_(std::make_unique<Cluster>(std::vector<NodeSpec>{})) {}

void Extender::say(const std::string& problem) const {
  if (!report_) return;
  try {
    report_(problem);
  } catch (...) {  // a report that cannot be made must not take the request with it
  }
}

Policy Extender::policy_for(const PodRequest& pod) const {
  if (pod.policy.empty()) return default_policy_;
  try {
    return sched::parse_policy(pod.policy);
  } catch (const std::invalid_argument&) {
    return default_policy_;
  }
}

// --- the allocation state --------------------------------------------------------------------

void Extender::rebuild_locked() {
  std::vector<NodeSpec> specs;
  std::set<std::string> models, profiles;
  index_.clear();
  for (const auto& [name, info] : nodes_) {
    NodeSpec spec = info.spec;
    const std::string& node = name;  // a structured binding cannot be captured (C++20)
    std::erase_if(spec.mig, [&](const sched::MigDevices& devices) {
      if (profiles.contains(devices.profile)) return false;
      if (static_cast<int>(profiles.size()) < Cluster::kMostMigProfiles) {
        profiles.insert(devices.profile);
        return false;
      }
      say(
          fmt::format("node {}: MIG profile {} is one more than the {} profiles Tessera places "
                      "on; its devices are not offered",
                      node, devices.profile, Cluster::kMostMigProfiles));
      return true;
    });
    if (spec.gpus > 0 && !models.contains(spec.model)) {
      if (static_cast<int>(models.size()) >= Cluster::kMostModels) {
        say(
            fmt::format("node {}: GPU model {} is one more than the {} models Tessera places on; "
                        "its GPUs are not offered",
                        name, spec.model, Cluster::kMostModels));
        spec.gpus = 0;
        spec.model.clear();
      } else {
        models.insert(spec.model);
      }
    }
    index_[name] = static_cast<int>(specs.size());
    specs.push_back(spec);
  }
  cluster_ = std::make_unique<Cluster>(specs);
  for (auto& [uid, hold] : holds_) {
    hold.applied = false;
    apply_locked(hold);
  }
  measure_workload_locked();
}

void Extender::measure_workload_locked() {
  std::vector<Request> requests;
  requests.reserve(holds_.size() + pending_.size());
  for (const auto& [uid, hold] : holds_) {
    if (hold.applied) requests.push_back(hold.request);
  }
  // A pending pod's share of a GPU in MiB is read against the GPU most nodes have.
  std::map<std::int64_t, int> memories;
  for (const auto& [name, info] : nodes_) {
    if (info.gpu_memory_mib > 0) ++memories[info.gpu_memory_mib];
  }
  const auto most =
      std::max_element(memories.begin(), memories.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  const std::int64_t gpu_memory = most == memories.end() ? 0 : most->first;
  for (const auto& [uid, pod] : pending_)
    requests.push_back(request_on(*cluster_, pod, gpu_memory));
  cluster_->set_target_workload(requests);
  workload_pods_ = holds_.size() + pending_.size();
}

void Extender::measure_workload_if_moved_locked() {
  const std::size_t now = holds_.size() + pending_.size();
  const std::size_t moved = now > workload_pods_ ? now - workload_pods_ : workload_pods_ - now;
  if (moved >= std::max<std::size_t>(8, workload_pods_ / 10)) measure_workload_locked();
}

void Extender::set_pending_locked(const std::string& uid, std::optional<PodRequest> pod) {
  if (pod) {
    pending_[uid] = std::move(*pod);
  } else {
    pending_.erase(uid);
  }
}

std::optional<PodRequest> Extender::pending_of(const nlohmann::json& pod) {
  if (kube::pod_finished(pod) || !string_at(pod, "/spec/nodeName"_json_pointer).empty())
    return std::nullopt;
  try {
    return pod_from_json(pod);
  } catch (const std::exception&) {  // filter refuses it with the reason when it is asked
    return std::nullopt;
  }
}

void Extender::apply_locked(Hold& hold) {
  if (hold.applied) return;
  const auto found = index_.find(hold.node);
  if (found == index_.end()) return;  // its node is unknown or gone
  const NodeInfo& info = nodes_.at(hold.node);
  if (kubelet_counts(info, hold.pod)) {  // the kubelet counts its GPUs: its CPU and memory here
    hold.gpus.clear();
    hold.choose_gpus = false;
  }
  const int gpus_here = cluster_->nodes()[found->second].gpus;
  Request request = request_on(*cluster_, hold.pod, info.gpu_memory_mib);
  request.gpu_milli = std::min(request.gpu_milli, kMilli);  // a GPU is held whole at most
  Placement placement;
  placement.node = found->second;
  const bool recorded_fits =
      !hold.choose_gpus &&
      std::all_of(hold.gpus.begin(), hold.gpus.end(), [&](int gpu) { return gpu < gpus_here; });
  if (recorded_fits) {  // the recorded GPUs are the ones the pod was given
    for (int gpu : hold.gpus) placement.gpu_index[placement.gpu_count++] = gpu;
    request.gpus = placement.gpu_count;
    if (request.gpus == 0) request.gpu_milli = 0;
  } else if (request.gpus > 0) {
    placement = cluster_->place_on(found->second, request, Policy::best_fit, random_);
    if (placement.node < 0) {
      say(
          fmt::format("pod {}/{} runs on {} without a usable record of its GPUs, and no room is "
                      "left there to hold for it",
                      hold.pod.namespace_name, hold.pod.name, hold.node));
      return;
    }
  }
  cluster_->allocate(request, placement);
  hold.request = request;
  hold.placement = placement;
  hold.applied = true;
}

void Extender::release_locked(Hold& hold) {
  if (!hold.applied) return;
  cluster_->release(hold.request, hold.placement);
  hold.applied = false;
}

void Extender::set_hold_locked(const std::string& uid, std::optional<Hold> hold) {
  const auto existing = holds_.find(uid);
  if (existing != holds_.end()) {
    const Hold& old = existing->second;
    if (hold && old.applied && old.node == hold->node && old.gpus == hold->gpus &&
        old.choose_gpus == hold->choose_gpus && old.pod.cpu_milli == hold->pod.cpu_milli &&
        old.pod.memory_mib == hold->pod.memory_mib && old.pod.gpus == hold->pod.gpus &&
        old.pod.gpumem_mib == hold->pod.gpumem_mib &&
        old.pod.gpumem_percent == hold->pod.gpumem_percent &&
        old.pod.gpucores == hold->pod.gpucores && old.pod.mig == hold->pod.mig) {
      return;  // a status update: nothing held changes
    }
    release_locked(existing->second);
    holds_.erase(existing);
  }
  if (hold) {
    apply_locked(*hold);
    holds_.emplace(uid, std::move(*hold));
  }
  measure_workload_if_moved_locked();
}

std::optional<Extender::Hold> Extender::hold_of(const nlohmann::json& pod, const std::string& uid) {
  if (kube::pod_finished(pod)) return std::nullopt;  // its resources are free again
  // Only a bound pod holds anything: an assignment on a pod not bound (a bind that failed
  // half-way, or one still in flight elsewhere) holds nothing. This extender's own binds in
  // flight are held through own_binds_.
  const std::string node = string_at(pod, "/spec/nodeName"_json_pointer);
  if (node.empty()) return std::nullopt;
  const std::string label =
      fmt::format("pod {}/{} ({})", string_at(pod, "/metadata/namespace"_json_pointer),
                  string_at(pod, "/metadata/name"_json_pointer), uid);

  Hold hold;
  hold.node = node;
  bool readable = true;
  try {
    hold.pod = pod_from_json(pod);
  } catch (const std::exception& error) {
    readable = false;
    say(fmt::format("{}: {}", label, error.what()));
  }
  std::optional<RecordedAssignment> record;
  const nlohmann::json::json_pointer annotations("/metadata/annotations");
  const bool has_record = pod.contains(annotations) && pod[annotations].is_object() &&
                          pod[annotations].contains(kAssignmentAnnotation);
  if (has_record) {
    try {
      record = assignment_from_annotation(pod[annotations][kAssignmentAnnotation]);
      if (record->node != node) {
        say(fmt::format("{}: {} names node {} but the pod runs on {}; holding GPUs there", label,
                        kAssignmentAnnotation, record->node, node));
        record.reset();
      }
    } catch (const std::exception& error) {
      say(fmt::format("{}: annotation {} cannot be read ({}); holding GPUs on {} for it", label,
                      kAssignmentAnnotation, error.what(), node));
    }
  }
  if (!readable) {
    if (!record) return std::nullopt;  // nothing known of what it holds
    hold.pod = {};                     // its recorded GPUs, whole
    hold.pod.uid = uid;
    hold.pod.gpus = static_cast<int>(record->gpus.size());
  }
  if (record) {
    hold.gpus = record->gpus;
  } else {
    // A pod placed by someone else (or whose record is damaged) still uses GPUs: the engine
    // picks as many to hold as it asks for. A pod without GPUs holds its CPU and memory, which
    // GPU pods on its node cannot have and fgd-balanced weighs.
    hold.choose_gpus = hold.pod.gpus > 0;
  }
  return hold;
}

// --- requests ---------------------------------------------------------------------------

bool Extender::parse_args(const std::string& body, Candidates& candidates, HttpReply& reply) {
  nlohmann::json args;
  try {
    args = parse_outside_json(body);
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
    candidates.pod = pod_from_json(*pod);
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
    std::vector<NodeInfo> infos;
    for (const auto& node : *items) {
      try {
        infos.push_back(node_from_json(node));
      } catch (const std::exception& error) {
        reply = bad_request(error.what());
        return false;
      }
      candidates.names.push_back(infos.back().spec.name);
      candidates.node_objects.push_back(node);
    }
    bool stale = false;
    {
      base::ReaderLock reading(mutex_);
      for (const NodeInfo& info : infos) {
        const auto known = nodes_.find(info.spec.name);
        stale = stale || known == nodes_.end() || !same_node(known->second, info);
      }
    }
    if (stale) {  // kube-scheduler knows nodes better than this extender's last look
      base::WriterLock writing(mutex_);
      for (const NodeInfo& info : infos) nodes_[info.spec.name] = info;
      rebuild_locked();
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

std::string Extender::refusal_locked(const PodRequest& pod, const std::string& node,
                                     Request& request, int& index) const {
  const auto found = index_.find(node);
  if (found == index_.end()) return "node unknown to Tessera";
  index = found->second;
  const NodeInfo& info = nodes_.at(node);
  if (kubelet_counts(info, pod)) {  // its replicas are the kubelet's to count: CPU and memory here
    PodRequest host_only = pod;
    host_only.gpus = 0;
    request = request_on(*cluster_, host_only, info.gpu_memory_mib);
    return cluster_->fits(cluster_->nodes()[index], request) ? std::string()
                                                             : "not enough CPU or memory";
  }
  if (pod.gpus > 0) {
    if (cluster_->nodes()[index].gpus == 0)
      return fmt::format("node has no GPUs Tessera knows of ({})", kGpusAnnotation);
    if (std::string why = model_refusal(pod, info.spec.model); !why.empty()) return why;
  }
  std::vector<std::string> asked;
  for (const auto& [profile, count] : pod.mig) {
    if (count > 0) asked.push_back(std::string(contract::kMigResourcePrefix) + profile);
  }
  if (asked.size() > static_cast<std::size_t>(sched::kMostMigAsks)) {
    return fmt::format("asks for {} MIG profiles ({}); a pod may ask for at most {}", asked.size(),
                       fmt::join(asked, ", "), sched::kMostMigAsks);
  }
  for (const auto& [profile, count] : pod.mig) {
    const int free = cluster_->mig_free(index, profile);
    if (free < count) {
      return fmt::format("has {} nvidia.com/mig-{} free; asks {}", std::max(free, 0), profile,
                         count);
    }
  }
  request = request_on(*cluster_, pod, info.gpu_memory_mib);
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

HttpReply Extender::measured(Verb verb, const std::string& body,
                             HttpReply (Extender::*answer)(const std::string&)) {
  const auto start = std::chrono::steady_clock::now();
  HttpReply reply;
  try {
    reply = (this->*answer)(body);
  } catch (...) {  // a defect, answered by the server with a 500: counted as refused
    metrics_.record(verb, std::chrono::steady_clock::now() - start, true, verb == Verb::bind);
    throw;
  }
  const auto took = std::chrono::steady_clock::now() - start;
  bool bind_failed = false;
  if (verb == Verb::bind && reply.status == 200) {  // an Error in the answer: the bind failed
    const nlohmann::json said = nlohmann::json::parse(reply.body, nullptr, false);
    bind_failed =
        !said.is_object() || !said.contains("Error") || said["Error"] != nlohmann::json("");
  }
  metrics_.record(verb, took, reply.status != 200, bind_failed);
  return reply;
}

HttpReply Extender::filter(const std::string& body) {
  return measured(Verb::filter, body, &Extender::answer_filter);
}
HttpReply Extender::prioritize(const std::string& body) {
  return measured(Verb::prioritize, body, &Extender::answer_prioritize);
}
HttpReply Extender::bind(const std::string& body) {
  return measured(Verb::bind, body, &Extender::answer_bind);
}

void Extender::bind_only_while(std::function<bool()> leading) {
  leading_ = std::move(leading);
}

std::string Extender::metrics() {
  StateSize state;
  state.leading = !leading_ || leading_();
  {
    base::ReaderLock reading(mutex_);
    state.nodes = nodes_.size();
    state.pods_held =
        static_cast<std::size_t>(std::count_if(holds_.begin(), holds_.end(), [](const auto& entry) {
          const Hold& hold = entry.second;
          return hold.pod.gpus > 0 || !hold.pod.mig.empty();
        }));
    state.pods_waiting = pending_.size();
  }
  return metrics_.render(state);
}

HttpReply Extender::answer_filter(const std::string& body) {
  Candidates candidates;
  HttpReply reply;
  if (!parse_args(body, candidates, reply)) return reply;
  nlohmann::json failed = nlohmann::json::object();
  nlohmann::json passed_names = nlohmann::json::array();
  nlohmann::json passed_nodes = nlohmann::json::array();
  {
    base::ReaderLock reading(mutex_);
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
  return json_reply(200, result);
}

HttpReply Extender::answer_prioritize(const std::string& body) {
  Candidates candidates;
  HttpReply reply;
  if (!parse_args(body, candidates, reply)) return reply;
  std::vector<std::pair<std::string, double>> scores;
  {
    base::ReaderLock reading(mutex_);
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
  return json_reply(200, result);
}

HttpReply Extender::answer_bind(const std::string& body) {
  nlohmann::json args;
  try {
    args = parse_outside_json(body);
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
  if (!dns_name(pod_name, kMostNameLength, true) || !dns_name(pod_ns, 63, false) ||
      !dns_name(node_name, kMostNameLength, true) || pod_uid.size() > 128) {
    return bad_request(
        "ExtenderBindingArgs: PodName and Node must be DNS subdomains, PodNamespace a DNS label, "
        "PodUID at most 128 bytes");
  }
  auto error = [](const std::string& reason) {
    return json_reply(200, nlohmann::json{{"Error", reason}});
  };

  // Another replica may lead and bind: binding here too could give its GPUs twice.
  const auto not_leading = [this] { return leading_ && !leading_(); };
  const std::string not_leader =
      "this replica of tessera scheduler is not the leader; the leader binds";
  if (not_leading()) return error(not_leader);

  // A bind waits on the API server: a few at a time, so that filter always finds a thread.
  struct InFlight {
    std::atomic<int>& count;
    ~InFlight() { --count; }
  } in_flight{binds_in_flight_};
  if (++binds_in_flight_ > limits_.most_concurrent_binds) {
    return error(
        fmt::format("{} binds are in flight already; try again", limits_.most_concurrent_binds));
  }
  const kube::Deadline deadline = Clock::now() + limits_.bind_budget;
  const std::string label = fmt::format("{}/{}", pod_ns, pod_name);
  const std::string pod_path = contract::api::pod(pod_ns, pod_name);

  // The pod as it is now: what it asks for, whether it is bound already, and its version, so
  // that the record is written only on the pod read here.
  const ApiResponse read = api_->get(pod_path, deadline);
  if (read.status != 200) {
    return error(fmt::format("cannot read pod {}: HTTP {} {}", label, read.status, read.error));
  }
  PodRequest pod;
  std::string version;
  try {
    const nlohmann::json object = parse_outside_json(read.body);
    const std::string current_uid = string_at(object, "/metadata/uid"_json_pointer);
    if (current_uid != pod_uid) {
      return error(
          fmt::format("pod {} is now another pod (UID {}, not {})", label, current_uid, pod_uid));
    }
    if (const std::string bound = string_at(object, "/spec/nodeName"_json_pointer);
        !bound.empty()) {
      return error(fmt::format("pod {} is bound to {} already; its assignment is left as it is",
                               label, bound));
    }
    version = string_at(object, "/metadata/resourceVersion"_json_pointer);
    pod = pod_from_json(object);
  } catch (const std::exception& failure) {
    return error(fmt::format("pod {} cannot be read: {}", label, failure.what()));
  }

  std::vector<int> gpus;
  std::vector<std::string> node_uuids;
  int gpu_milli = 0;
  {
    base::WriterLock writing(mutex_);
    Request request;
    int index = -1;
    if (const auto stale = holds_.find(pod_uid); stale != holds_.end()) {
      release_locked(stale->second);  // an earlier attempt's: this one replaces it
      holds_.erase(stale);
    }
    if (std::string why = refusal_locked(pod, node_name, request, index); !why.empty()) {
      return error(fmt::format("pod {} no longer fits node {}: {}", label, node_name, why));
    }
    Hold hold;
    hold.node = node_name;
    hold.pod = pod;
    hold.placement = cluster_->place_on(index, request, policy_for(pod), random_);
    for (int k = 0; k < hold.placement.gpu_count; ++k) gpus.push_back(hold.placement.gpu_index[k]);
    hold.gpus = gpus;
    hold.request = request;
    gpu_milli = request.gpu_milli;
    node_uuids = nodes_.at(node_name).gpu_uuids;
    // Held now, so that concurrent binds cannot take the same room.
    cluster_->allocate(request, hold.placement);
    hold.applied = true;
    holds_[pod_uid] = std::move(hold);
    pending_.erase(pod_uid);  // held now, not waiting
    own_binds_[pod_uid] = Clock::now();
    measure_workload_if_moved_locked();
  }
  auto give_back = [&] {
    base::WriterLock writing(mutex_);
    own_binds_.erase(pod_uid);
    if (const auto held = holds_.find(pod_uid); held != holds_.end()) {
      release_locked(held->second);
      holds_.erase(held);
    }
  };

  // Leadership may have lapsed while the pod was read.
  if (not_leading()) {
    give_back();
    return error(not_leader);
  }
  RecordedAssignment record{node_name, gpus, {}, gpu_milli};
  for (const int gpu : gpus) {
    if (static_cast<std::size_t>(gpu) < node_uuids.size()) record.uuids.push_back(node_uuids[gpu]);
  }
  if (record.uuids.size() != gpus.size()) record.uuids.clear();
  nlohmann::json patch{
      {"metadata",
       {{"annotations", {{kAssignmentAnnotation, kube::assignment_annotation(record)}}}}}};
  // A merge patch that names the version is refused (409) if the pod changed since.
  if (!version.empty()) patch["metadata"]["resourceVersion"] = version;
  const ApiResponse recorded = api_->patch(pod_path, dump_outside_json(patch), deadline);
  if (recorded.status != 200) {
    give_back();
    return error(fmt::format("recording the assignment on pod {} failed: HTTP {} {}{}", label,
                             recorded.status,
                             recorded.status == 0 ? recorded.error : recorded.body.substr(0, 512),
                             recorded.status == 409 ? " (the pod changed since it was read)" : ""));
  }
  const nlohmann::json binding{
      {"apiVersion", "v1"},
      {"kind", "Binding"},
      {"metadata", {{"name", pod_name}, {"namespace", pod_ns}, {"uid", pod_uid}}},
      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node_name}}}};
  const ApiResponse bound =
      api_->post(contract::api::pod_binding(pod_ns, pod_name), binding.dump(), deadline);
  if (bound.status != 200 && bound.status != 201) {
    give_back();
    // The record must not outlive the bind; an unbound pod's record is ignored anyway, so a
    // revert that fails too (the API server is down) leaves nothing held.
    const nlohmann::json revert{
        {"metadata", {{"annotations", {{kAssignmentAnnotation, nullptr}}}}}};
    const ApiResponse reverted =
        api_->patch(pod_path, revert.dump(), Clock::now() + std::chrono::seconds(2));
    if (reverted.status != 200) {
      say(fmt::format("pod {}: the assignment of a failed bind could not be removed: HTTP {} {}",
                      label, reverted.status, reverted.error));
    }
    return error(fmt::format("binding {} to {} failed: HTTP {} {}", label, node_name, bound.status,
                             bound.status == 0 ? bound.error : bound.body.substr(0, 512)));
  }
  return json_reply(200, nlohmann::json{{"Error", ""}});
}

// --- lists and watches -----------------------------------------------------------------

void Extender::replace_nodes(const nlohmann::json& items) {
  std::map<std::string, NodeInfo> node_infos;
  // One object that cannot be read is reported and skipped; the rest still count.
  for (const auto& item : items) {
    try {
      NodeInfo info = node_from_json(item);
      node_infos[info.spec.name] = info;
    } catch (const std::exception& failure) {
      say(fmt::format("listing {}: skipped an object: {}", collection_path(Resource::nodes),
                      failure.what()));
    }
  }
  base::WriterLock writing(mutex_);
  nodes_ = std::move(node_infos);
  rebuild_locked();
}

void Extender::replace_pods(const nlohmann::json& items) {
  std::map<std::string, Hold> holds;
  std::map<std::string, PodRequest> pending;
  for (const auto& item : items) {
    try {
      const std::string uid = string_at(item, "/metadata/uid"_json_pointer);
      if (uid.empty() || uid.size() > 128) throw std::runtime_error("a pod without metadata.uid");
      if (auto hold = hold_of(item, uid)) {
        holds[uid] = std::move(*hold);
      } else if (auto waiting = pending_of(item)) {
        pending[uid] = std::move(*waiting);
      }
    } catch (const std::exception& failure) {
      say(fmt::format("listing {}: skipped an object: {}", collection_path(Resource::pods),
                      failure.what()));
    }
  }
  base::WriterLock writing(mutex_);
  // A list may have been read before this extender's latest binds reached the API server:
  // those stay held a while, unless the list shows them already.
  const auto now = Clock::now();
  for (auto bound = own_binds_.begin(); bound != own_binds_.end();) {
    const auto held = holds_.find(bound->first);
    if (now - bound->second > kOwnBindGrace || held == holds_.end()) {
      bound = own_binds_.erase(bound);
      continue;
    }
    holds.try_emplace(bound->first, held->second);
    pending.erase(bound->first);
    ++bound;
  }
  holds_ = std::move(holds);
  pending_ = std::move(pending);
  rebuild_locked();
}

void Extender::apply_node_event(std::string_view type, const nlohmann::json& object) {
  const std::string name = string_at(object, "/metadata/name"_json_pointer);
  if (name.empty()) throw std::runtime_error(fmt::format("a {} event's node has no name", type));
  std::optional<NodeInfo> info;
  if (type != "DELETED") {
    try {
      info = node_from_json(object);
    } catch (const std::exception& error) {  // unusable now: offered to nobody
      say(fmt::format("watching nodes: {}; the node is not offered", error.what()));
    }
  }
  base::WriterLock writing(mutex_);
  const auto known = nodes_.find(name);
  if (info && known != nodes_.end() && same_node(known->second, *info)) {
    return;  // a status update: nothing Tessera uses changed
  }
  if (!info && known == nodes_.end()) return;
  if (info) {
    nodes_[name] = *info;
  } else {
    nodes_.erase(name);
  }
  rebuild_locked();
}

void Extender::apply_pod_event(std::string_view type, const nlohmann::json& object) {
  const std::string uid = string_at(object, "/metadata/uid"_json_pointer);
  if (uid.empty() || uid.size() > 128) {
    throw std::runtime_error(fmt::format("a {} event's pod has no metadata.uid", type));
  }
  std::optional<Hold> hold;
  std::optional<PodRequest> waiting;
  if (type != "DELETED") hold = hold_of(object, uid);
  if (type != "DELETED" && !hold) waiting = pending_of(object);
  base::WriterLock writing(mutex_);
  if (type == "DELETED" || kube::pod_finished(object)) {
    own_binds_.erase(uid);
  } else if (!hold && own_binds_.contains(uid)) {
    return;  // not bound yet: this extender's bind holds its room
  }
  set_pending_locked(uid, std::move(waiting));
  set_hold_locked(uid, std::move(hold));
}

kube::CollectionHandlers Extender::handlers(Resource resource) {
  if (resource == Resource::nodes) {
    return {[this](const nlohmann::json& items) { replace_nodes(items); },
            [this](std::string_view type, const nlohmann::json& object) {
              apply_node_event(type, object);
            }};
  }
  return {[this](const nlohmann::json& items) { replace_pods(items); },
          [this](std::string_view type, const nlohmann::json& object) {
            apply_pod_event(type, object);
          }};
}

bool Extender::sync(std::string& error) {
  std::string version;
  return kube::list_collection(*api_, collection_path(Resource::nodes), handlers(Resource::nodes),
                               version, error) &&
         kube::list_collection(*api_, collection_path(Resource::pods), handlers(Resource::pods),
                               version, error);
}

kube::WatchEnd Extender::apply_event(Resource resource, const std::string& line,
                                     std::string& version, std::string& why) {
  return kube::apply_watch_line(line, handlers(resource), version, why);
}

void Extender::follow(Resource resource, const std::atomic<bool>& stop,
                      const kube::Reporter& report) {
  kube::follow_collection(*api_, collection_path(resource), handlers(resource), stop, report);
}

}  // namespace tessera::extender
