// The extender's wire format: kube-scheduler's ExtenderArgs, ExtenderFilterResult,
// HostPriorityList, ExtenderBindingArgs and ExtenderBindingResult as JSON (field names
// matched case-insensitively, as Go's decoder does), and pods as listed or watched, read into
// what they hold or wait for. Every body is bounded and checked; a bad one is refused with the
// reason (HTTP 400).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/log.h"
#include "extender/cluster_objects.h"
#include "extender/cluster_state.h"
#include "kube/reflector.h"

namespace tessera::extender {

struct HttpReply {
  int status = 200;
  std::string body;
};

HttpReply json_reply(int status, const nlohmann::json& value);
HttpReply bad_request(const std::string& reason);

// ExtenderArgs: the pod and its candidate nodes, whole (nodes, node_objects) or by name.
struct Candidates {
  PodRequest pod;
  std::vector<NodeInfo> nodes;               // when kube-scheduler sent whole nodes
  std::vector<nlohmann::json> node_objects;  // those nodes as sent, for the answer
  std::vector<std::string> names;
  bool names_only = false;
};
// False with `reply` (400 and the reason) when the body is not ExtenderArgs Tessera can read.
bool parse_extender_args(const std::string& body, Candidates& candidates, HttpReply& reply);

// ExtenderFilterResult: `refusals[i]` says why candidate i may not be used ("" : it may).
HttpReply filter_result(const Candidates& candidates, const std::vector<std::string>& refusals);
// HostPriorityList: the engine's scores scaled to kube-scheduler's 0..10 across the
// candidates; a node where the pod does not fit (nullopt) gets 0.
HttpReply prioritize_result(
    const std::vector<std::pair<std::string, std::optional<double>>>& scores);

struct BindArgs {
  std::string pod_name, pod_namespace, pod_uid, node;
};
// False with `reply` (400 and the reason) unless every field is there and well formed.
bool parse_bind_args(const std::string& body, BindArgs& args, HttpReply& reply);
// ExtenderBindingResult: `error` empty for a bind that succeeded.
HttpReply bind_result(const std::string& error);

// ExtenderPreemptionArgs: the pod that would preempt, and the nodes kube-scheduler found
// victims on (NodeNameToVictims or NodeNameToMetaVictims; its victims themselves are not
// needed), each with its count of PodDisruptionBudget violations.
struct PreemptionArgs {
  PodRequest pod;
  std::vector<std::pair<std::string, std::int64_t>> nodes;
};
// False with `reply` (400 and the reason) when the body is not ExtenderPreemptionArgs.
bool parse_preemption_args(const std::string& body, PreemptionArgs& args, HttpReply& reply);
struct PreemptionVictims {
  std::vector<std::string> uids;
  std::int64_t pdb_violations = 0;
};
// ExtenderPreemptionResult: NodeNameToMetaVictims, the nodes where preemption makes room.
HttpReply preemption_result(const std::vector<std::pair<std::string, PreemptionVictims>>& victims);

// What a listed or watched pod holds, if anything; problems go to `report`.
std::optional<Hold> hold_of(const nlohmann::json& pod, const std::string& uid,
                            const base::Reporter& report);
// What a listed or watched pod waiting for a node asks for, if it can be read.
std::optional<PodRequest> pending_of(const nlohmann::json& pod);

}  // namespace tessera::extender
