// The names Tessera's parts meet each other by in the Kubernetes API: annotations and labels
// on pods and nodes, Tessera's and those of NVIDIA and HAMi it reads. The extender writes a
// pod's assignment and the node agent reads it; the node agent writes its node's GPUs and the
// extender reads them.
#pragma once

namespace tessera::contract {

// On a pod.
// Where the scheduler placed it: {"node": ..., "gpus": [...], "uuids": [...], "milli": ...}
// (kube/objects.h reads and writes it).
inline constexpr const char* kAssignmentAnnotation = "tessera.io/assignment";
// The placement policy it asks for (tessera scheduler --policy's names).
inline constexpr const char* kPolicyAnnotation = "tessera.io/policy";
// Its containers' priority on their GPUs: high or low (beside HAMi's nvidia.com/priority).
inline constexpr const char* kPriorityAnnotation = "tessera.io/priority";
// "true": its containers may use device time beyond their gpucores that no one else wants.
inline constexpr const char* kBurstAnnotation = "tessera.io/burst";
// HAMi's and NVIDIA's, read as they mean there.
inline constexpr const char* kHamiPolicyAnnotation = "hami.io/gpu-scheduler-policy";
inline constexpr const char* kUseGpuTypeAnnotation = "nvidia.com/use-gputype";
inline constexpr const char* kNoUseGpuTypeAnnotation = "nvidia.com/nouse-gputype";

// On a node, written by its node agent.
// Every GPU it serves, with how it is shared, for the scheduler (node/labels.h writes it,
// contract/gpu_numbering.h says how the scheduler numbers them).
inline constexpr const char* kGpusAnnotation = "tessera.io/gpus";
inline constexpr const char* kConfigAnnotation = "tessera.io/config";  // the config in force
inline constexpr const char* kConfigErrorAnnotation = "tessera.io/config-error";  // why refused
// Dynamic MIG (docs/mig.md): the layout a node's MIG GPUs should have, written by the
// scheduler or a person and applied by the node agent to instances no pod holds. JSON, GPU
// index to profile counts as NVML names the profiles: {"0": {"3g.40gb": 1, "1g.10gb": 4}}.
inline constexpr const char* kMigLayoutAnnotation = "tessera.io/mig-layout";
// What the node agent made of it: "success", or "failed: " and why (the GPUs keep the layout
// they had), as NVIDIA's mig-manager reports nvidia.com/mig.config.state.
inline constexpr const char* kMigLayoutStateAnnotation = "tessera.io/mig-layout-state";
// NVIDIA's label naming the config a node runs (read by the node agent).
inline constexpr const char* kConfigLabel = "nvidia.com/device-plugin.config";

// The scheduler names pods may ask for: Tessera's profile, and gpushare's.
inline constexpr const char* kSchedulerName = "tessera";
inline constexpr const char* kGpushareSchedulerName = "gpushare-scheduler";

}  // namespace tessera::contract
