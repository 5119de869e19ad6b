#include "extender/extender.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "contract/annotations.h"
#include "kube/json_input.h"

namespace tessera::extender {

using kube::ApiResponse;
using kube::parse_outside_json;
using kube::string_at;

namespace {

using Clock = std::chrono::steady_clock;

kube::Collection collection_of(Extender::Resource resource) {
  return resource == Extender::Resource::nodes ? kube::Collection::all_nodes()
                                               : kube::Collection::all_pods();
}

}  // namespace

Extender::Extender(Policy default_policy, std::unique_ptr<kube::Cluster> cluster,
                   base::Reporter report, ExtenderLimits limits)
    : default_policy_(default_policy),
      cluster_(std::move(cluster)),
      report_(std::move(report)),
      limits_(limits),
      state_(report_) {}

void Extender::say(const std::string& problem) const {
  base::tell(report_, problem);
}

Policy Extender::policy_for(const PodRequest& pod) const {
  if (pod.policy.empty()) return default_policy_;
  try {
    return sched::parse_policy(pod.policy);
  } catch (const std::invalid_argument&) {
    return default_policy_;
  }
}

// --- requests ---------------------------------------------------------------------------

bool Extender::parse_args(const std::string& body, Candidates& candidates, HttpReply& reply) {
  if (!parse_extender_args(body, candidates, reply)) return false;
  if (candidates.names_only) return true;
  bool stale = false;
  {
    base::ReaderLock reading(mutex_);
    for (const NodeInfo& info : candidates.nodes) stale = stale || !state_.knows(info);
  }
  if (stale) {  // kube-scheduler knows nodes better than this extender's last look
    base::WriterLock writing(mutex_);
    state_.update_nodes(candidates.nodes);
  }
  return true;
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
HttpReply Extender::preempt(const std::string& body) {
  return measured(Verb::preempt, body, &Extender::answer_preempt);
}

void Extender::bind_only_while(std::function<bool()> leading) {
  leading_ = std::move(leading);
}

std::string Extender::metrics() {
  StateSize state;
  {
    base::ReaderLock reading(mutex_);
    state = state_.size();
  }
  state.leading = !leading_ || leading_();
  return metrics_.render(state);
}

HttpReply Extender::answer_filter(const std::string& body) {
  Candidates candidates;
  HttpReply reply;
  if (!parse_args(body, candidates, reply)) return reply;
  std::vector<std::string> refusals;
  std::optional<MigRecut> recut;
  {
    base::ReaderLock reading(mutex_);
    for (const std::string& name : candidates.names) {
      Request request;
      int index = -1;
      refusals.push_back(state_.refusal(candidates.pod, name, request, index));
    }
    // A MIG pod that fits nowhere as the GPUs are cut: ask a node to cut one again. The pod
    // waits; kube-scheduler tries it again once the node serves the new devices.
    const bool fits_somewhere = std::any_of(refusals.begin(), refusals.end(),
                                            [](const std::string& r) { return r.empty(); });
    if (!fits_somewhere && !candidates.pod.mig.empty() && (!leading_ || leading_()))
      recut = state_.plan_mig_recut(candidates.pod, candidates.names);
  }
  if (recut && ask_for_recut(*recut)) {
    const auto at = std::find(candidates.names.begin(), candidates.names.end(), recut->node);
    refusals[static_cast<std::size_t>(at - candidates.names.begin())] += fmt::format(
        "; GPU {} is being cut again for it ({})", recut->gpu, contract::kMigLayoutAnnotation);
  }
  return filter_result(candidates, refusals);
}

bool Extender::ask_for_recut(const MigRecut& recut) {
  const std::string layout = nlohmann::json{{std::to_string(recut.gpu), recut.layout}}.dump();
  const auto now = std::chrono::steady_clock::now();
  {
    base::MutexLock locked(recuts_mutex_);
    const auto asked = recuts_.find(recut.node);
    if (asked != recuts_.end() && now - asked->second.second < kRecutPatience) {
      return asked->second.first == layout;  // asked already (or another cut is under way)
    }
    recuts_[recut.node] = {layout, now};
  }
  const nlohmann::json patch{
      {"metadata", {{"annotations", {{contract::kMigLayoutAnnotation, layout}}}}}};
  const kube::ApiResponse answer =
      cluster_->patch_node(recut.node, patch, now + std::chrono::seconds(2));
  if (answer.status != 200) {
    say(fmt::format("node {}: {} not written: HTTP {} {}", recut.node,
                    contract::kMigLayoutAnnotation, answer.status,
                    answer.status == 0 ? answer.error : answer.body.substr(0, 300)));
    return false;
  }
  say(fmt::format("node {}: GPU {} to be cut as {} for a MIG pod that fits nowhere", recut.node,
                  recut.gpu, layout));
  return true;
}

HttpReply Extender::answer_prioritize(const std::string& body) {
  Candidates candidates;
  HttpReply reply;
  if (!parse_args(body, candidates, reply)) return reply;
  std::vector<std::pair<std::string, std::optional<double>>> scores;
  {
    base::ReaderLock reading(mutex_);
    const Policy policy = policy_for(candidates.pod);
    for (const std::string& name : candidates.names)
      scores.emplace_back(name, state_.score(candidates.pod, name, policy));
  }
  return prioritize_result(scores);
}

HttpReply Extender::answer_preempt(const std::string& body) {
  PreemptionArgs args;
  HttpReply reply;
  if (!parse_preemption_args(body, args, reply)) return reply;
  std::vector<std::string> nodes;
  for (const auto& [node, pdb_violations] : args.nodes) nodes.push_back(node);
  std::vector<std::optional<std::vector<std::string>>> chosen;
  {
    base::ReaderLock reading(mutex_);
    chosen = state_.preemption_victims(args.pod, nodes);
  }
  std::vector<std::pair<std::string, PreemptionVictims>> victims;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    // Tessera does not read PodDisruptionBudgets: kube-scheduler's count for the node stands.
    if (chosen[k])
      victims.emplace_back(nodes[k],
                           PreemptionVictims{std::move(*chosen[k]), args.nodes[k].second});
  }
  return preemption_result(victims);
}

HttpReply Extender::answer_bind(const std::string& body) {
  BindArgs args;
  HttpReply refused;
  if (!parse_bind_args(body, args, refused)) return refused;
  const std::string &pod_name = args.pod_name, &pod_ns = args.pod_namespace;
  const std::string &pod_uid = args.pod_uid, &node_name = args.node;
  const auto error = bind_result;

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
  const kube::ObjectName pod_object{pod_ns, pod_name};
  const std::string label = pod_object.label();

  // The pod as it is now: what it asks for, whether it is bound already, and its version, so
  // that the record is written only on the pod read here.
  const ApiResponse read = cluster_->get_pod(pod_object, deadline);
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

  std::optional<Reservation> reserved;
  {
    base::WriterLock writing(mutex_);
    std::string why;
    reserved = state_.reserve(pod_uid, pod, node_name, policy_for(pod), Clock::now(), why);
    if (!reserved) {
      return error(fmt::format("pod {} no longer fits node {}: {}", label, node_name, why));
    }
  }
  auto give_back = [&] {
    base::WriterLock writing(mutex_);
    state_.give_back(pod_uid);
  };

  // Leadership may have lapsed while the pod was read.
  if (not_leading()) {
    give_back();
    return error(not_leader);
  }
  RecordedAssignment record{node_name, reserved->gpus, {}, reserved->gpu_milli};
  for (const int gpu : reserved->gpus) {
    if (static_cast<std::size_t>(gpu) < reserved->node_uuids.size())
      record.uuids.push_back(reserved->node_uuids[gpu]);
  }
  if (record.uuids.size() != reserved->gpus.size()) record.uuids.clear();
  nlohmann::json patch{
      {"metadata",
       {{"annotations", {{kAssignmentAnnotation, kube::assignment_annotation(record)}}}}}};
  // A merge patch that names the version is refused (409) if the pod changed since.
  if (!version.empty()) patch["metadata"]["resourceVersion"] = version;
  const ApiResponse recorded = cluster_->patch_pod(pod_object, patch, deadline);
  if (recorded.status != 200) {
    give_back();
    return error(fmt::format("recording the assignment on pod {} failed: HTTP {} {}{}", label,
                             recorded.status,
                             recorded.status == 0 ? recorded.error : recorded.body.substr(0, 512),
                             recorded.status == 409 ? " (the pod changed since it was read)" : ""));
  }
  const ApiResponse bound = cluster_->bind_pod(pod_object, pod_uid, node_name, deadline);
  if (bound.status != 200 && bound.status != 201) {
    give_back();
    // The record must not outlive the bind; an unbound pod's record is ignored anyway, so a
    // revert that fails too (the API server is down) leaves nothing held.
    const nlohmann::json revert{
        {"metadata", {{"annotations", {{kAssignmentAnnotation, nullptr}}}}}};
    const ApiResponse reverted =
        cluster_->patch_pod(pod_object, revert, Clock::now() + std::chrono::seconds(2));
    if (reverted.status != 200) {
      say(fmt::format("pod {}: the assignment of a failed bind could not be removed: HTTP {} {}",
                      label, reverted.status, reverted.error));
    }
    return error(fmt::format("binding {} to {} failed: HTTP {} {}", label, node_name, bound.status,
                             bound.status == 0 ? bound.error : bound.body.substr(0, 512)));
  }
  return bind_result("");
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
      say(fmt::format("listing {}: skipped an object: {}",
                      collection_of(Resource::nodes).describe(), failure.what()));
    }
  }
  base::WriterLock writing(mutex_);
  state_.replace_nodes(std::move(node_infos));
}

void Extender::replace_pods(const nlohmann::json& items) {
  std::map<std::string, Hold> holds;
  std::map<std::string, PodRequest> pending;
  for (const auto& item : items) {
    try {
      const std::string uid = string_at(item, "/metadata/uid"_json_pointer);
      if (uid.empty() || uid.size() > 128) throw std::runtime_error("a pod without metadata.uid");
      if (auto hold = hold_of(item, uid, report_)) {
        holds[uid] = std::move(*hold);
      } else if (auto waiting = pending_of(item)) {
        pending[uid] = std::move(*waiting);
      }
    } catch (const std::exception& failure) {
      say(fmt::format("listing {}: skipped an object: {}", collection_of(Resource::pods).describe(),
                      failure.what()));
    }
  }
  base::WriterLock writing(mutex_);
  state_.replace_pods(std::move(holds), std::move(pending), Clock::now());
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
  state_.node_event(name, std::move(info));
}

void Extender::apply_pod_event(std::string_view type, const nlohmann::json& object) {
  const std::string uid = string_at(object, "/metadata/uid"_json_pointer);
  if (uid.empty() || uid.size() > 128) {
    throw std::runtime_error(fmt::format("a {} event's pod has no metadata.uid", type));
  }
  std::optional<Hold> hold;
  std::optional<PodRequest> waiting;
  if (type != "DELETED") hold = hold_of(object, uid, report_);
  if (type != "DELETED" && !hold) waiting = pending_of(object);
  const bool gone = type == "DELETED" || kube::pod_finished(object);
  base::WriterLock writing(mutex_);
  state_.pod_event(uid, gone, std::move(hold), std::move(waiting));
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

base::Status Extender::sync() {
  std::string version;
  const base::Status nodes = kube::list_collection(*cluster_, collection_of(Resource::nodes),
                                                   handlers(Resource::nodes), version);
  if (!nodes.ok()) return nodes;
  return kube::list_collection(*cluster_, collection_of(Resource::pods), handlers(Resource::pods),
                               version);
}

kube::WatchEnd Extender::apply_event(Resource resource, const std::string& line,
                                     std::string& version, std::string& why) {
  return kube::apply_watch_line(line, handlers(resource), version, why);
}

void Extender::follow(Resource resource, const std::atomic<bool>& stop,
                      const base::Reporter& report) {
  kube::follow_collection(*cluster_, collection_of(resource), handlers(resource), stop, report);
}

}  // namespace tessera::extender
