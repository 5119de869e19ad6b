#include "extender/wire.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "kube/json_input.h"

namespace tessera::extender {

using kube::dns_name;
using kube::dump_outside_json;
using kube::parse_outside_json;
using kube::string_at;

namespace {

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

HttpReply json_reply(int status, const nlohmann::json& value) {
  return {status, dump_outside_json(value)};
}

HttpReply bad_request(const std::string& reason) {
  return json_reply(400, nlohmann::json{{"Error", reason}});
}

namespace {

// A request's body as JSON; on failure `reply` is the 400 that says why.
bool parse_body(const std::string& body, nlohmann::json& args, HttpReply& reply) {
  try {
    args = parse_outside_json(body);
  } catch (const std::exception& error) {
    reply = bad_request(fmt::format("the body is not JSON: {}", error.what()));
    return false;
  }
  return true;
}

// The Pod field of kube-scheduler's `what` (ExtenderArgs, ExtenderPreemptionArgs); on failure
// `reply` is the 400 that says why.
bool parse_pod(const nlohmann::json& args, const char* what, PodRequest& pod, HttpReply& reply) {
  const nlohmann::json* object = field(args, "Pod");
  if (object == nullptr || !object->is_object()) {
    reply = bad_request(fmt::format("{} has no Pod object", what));
    return false;
  }
  try {
    pod = pod_from_json(*object);
  } catch (const std::exception& error) {
    reply = bad_request(error.what());
    return false;
  }
  return true;
}

}  // namespace

bool parse_extender_args(const std::string& body, Candidates& candidates, HttpReply& reply) {
  nlohmann::json args;
  if (!parse_body(body, args, reply)) return false;
  if (!parse_pod(args, "ExtenderArgs", candidates.pod, reply)) return false;
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
    candidates.nodes = std::move(infos);
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

HttpReply filter_result(const Candidates& candidates, const std::vector<std::string>& refusals) {
  nlohmann::json failed = nlohmann::json::object();
  nlohmann::json passed_names = nlohmann::json::array();
  nlohmann::json passed_nodes = nlohmann::json::array();
  for (std::size_t i = 0; i < candidates.names.size(); ++i) {
    if (!refusals[i].empty()) {
      failed[candidates.names[i]] = refusals[i];
      continue;
    }
    passed_names.push_back(candidates.names[i]);
    if (!candidates.names_only) passed_nodes.push_back(candidates.node_objects[i]);
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

HttpReply prioritize_result(
    const std::vector<std::pair<std::string, std::optional<double>>>& scores) {
  double low = 1e300, high = -1e300;
  for (const auto& [name, score] : scores) {
    if (!score) continue;
    low = std::min(low, *score);
    high = std::max(high, *score);
  }
  nlohmann::json result = nlohmann::json::array();
  for (const auto& [name, score] : scores) {
    long scaled = 0;
    if (score) scaled = high > low ? std::lround(10 * (*score - low) / (high - low)) : 5;
    result.push_back({{"Host", name}, {"Score", scaled}});
  }
  return json_reply(200, result);
}

bool parse_bind_args(const std::string& body, BindArgs& parsed, HttpReply& reply) {
  nlohmann::json args;
  if (!parse_body(body, args, reply)) return false;
  const nlohmann::json* name = field(args, "PodName");
  const nlohmann::json* ns = field(args, "PodNamespace");
  const nlohmann::json* uid = field(args, "PodUID");
  const nlohmann::json* node = field(args, "Node");
  for (const auto& [value, what] : {std::pair{name, "PodName"}, std::pair{ns, "PodNamespace"},
                                    std::pair{uid, "PodUID"}, std::pair{node, "Node"}}) {
    if (value == nullptr || !value->is_string() || value->get<std::string>().empty()) {
      reply = bad_request(fmt::format("ExtenderBindingArgs.{} is missing or not a string", what));
      return false;
    }
  }
  const std::string pod_name = name->get<std::string>(), pod_ns = ns->get<std::string>();
  const std::string pod_uid = uid->get<std::string>(), node_name = node->get<std::string>();
  if (!dns_name(pod_name, kMostNameLength, true) || !dns_name(pod_ns, 63, false) ||
      !dns_name(node_name, kMostNameLength, true) || pod_uid.size() > 128) {
    reply = bad_request(
        "ExtenderBindingArgs: PodName and Node must be DNS subdomains, PodNamespace a DNS label, "
        "PodUID at most 128 bytes");
    return false;
  }
  parsed = {pod_name, pod_ns, pod_uid, node_name};
  return true;
}

bool parse_preemption_args(const std::string& body, PreemptionArgs& parsed, HttpReply& reply) {
  nlohmann::json args;
  if (!parse_body(body, args, reply)) return false;
  if (!parse_pod(args, "ExtenderPreemptionArgs", parsed.pod, reply)) return false;
  // Whole pods without nodeCacheCapable, UIDs with it: either way Tessera needs only the nodes
  // and their PodDisruptionBudget counts, and chooses the victims itself.
  const nlohmann::json* meta = field(args, "NodeNameToMetaVictims");
  const nlohmann::json* whole = field(args, "NodeNameToVictims");
  const nlohmann::json* victims = meta != nullptr && !meta->is_null() ? meta : whole;
  const char* which = victims == meta ? "NodeNameToMetaVictims" : "NodeNameToVictims";
  if (victims == nullptr || victims->is_null()) {
    reply = bad_request(
        "ExtenderPreemptionArgs has neither NodeNameToVictims nor NodeNameToMetaVictims");
    return false;
  }
  if (!victims->is_object()) {
    reply = bad_request(fmt::format("ExtenderPreemptionArgs.{} is not an object", which));
    return false;
  }
  parsed.nodes.clear();
  for (auto it = victims->begin(); it != victims->end(); ++it) {
    if (!dns_name(it.key(), kMostNameLength, true)) {
      reply = bad_request(fmt::format("ExtenderPreemptionArgs.{}: '{}' is not a node name", which,
                                      it.key().substr(0, 64)));
      return false;
    }
    std::int64_t violations = 0;
    if (!it.value().is_null()) {
      const nlohmann::json* count = field(it.value(), "NumPDBViolations");
      if (!it.value().is_object() ||
          (count != nullptr && !count->is_null() && !count->is_number_integer())) {
        reply = bad_request(fmt::format(
            "ExtenderPreemptionArgs.{}[{}] is not Victims with a whole NumPDBViolations", which,
            it.key()));
        return false;
      }
      if (count != nullptr && count->is_number_integer())
        violations = std::clamp<std::int64_t>(count->get<std::int64_t>(), 0, 1 << 30);
    }
    parsed.nodes.emplace_back(it.key(), violations);
  }
  return true;
}

HttpReply preemption_result(const std::vector<std::pair<std::string, PreemptionVictims>>& victims) {
  nlohmann::json nodes = nlohmann::json::object();
  for (const auto& [node, chosen] : victims) {
    nlohmann::json pods = nlohmann::json::array();
    for (const std::string& uid : chosen.uids) pods.push_back({{"UID", uid}});
    nodes[node] = {{"Pods", pods}, {"NumPDBViolations", chosen.pdb_violations}};
  }
  return json_reply(200, nlohmann::json{{"NodeNameToMetaVictims", nodes}});
}

HttpReply bind_result(const std::string& error) {
  return json_reply(200, nlohmann::json{{"Error", error}});
}

std::optional<Hold> hold_of(const nlohmann::json& pod, const std::string& uid,
                            const base::Reporter& report) {
  auto say = [&report](const std::string& problem) {
    if (!report) return;
    try {
      report(problem);
    } catch (...) {  // a report that cannot be made must not take the pod with it
    }
  };
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
    hold.pod.priority = std::numeric_limits<std::int32_t>::max();  // unknown: never preempted
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

std::optional<PodRequest> pending_of(const nlohmann::json& pod) {
  if (kube::pod_finished(pod) || !string_at(pod, "/spec/nodeName"_json_pointer).empty())
    return std::nullopt;
  try {
    return pod_from_json(pod);
  } catch (const std::exception&) {  // filter refuses it with the reason when it is asked
    return std::nullopt;
  }
}

}  // namespace tessera::extender
