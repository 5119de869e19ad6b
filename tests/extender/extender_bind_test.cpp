// The extender's bind sequence on the in-memory API: read the pod, hold its room, record the
// assignment on the pod (only on the version read), bind it, and undo the record and the
// hold when a later step fails. No HTTP: kube::ApiCluster's paths are tested in kube_test.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "contract/annotations.h"
#include "extender/extender.h"
#include "memory_cluster.h"

namespace tessera::extender {
namespace {

// A node the node agent has published: one 40 GiB A100 for each of `gpus`.
nlohmann::json gpu_node(const std::string& name, int gpus) {
  const nlohmann::json published{
      {"model", "NVIDIA-A100-SXM4-40GB"}, {"count", gpus}, {"memory_mib", 40960}};
  return {{"metadata",
           {{"name", name}, {"annotations", {{contract::kGpusAnnotation, published.dump()}}}}},
          {"status", {{"allocatable", {{"cpu", "64"}, {"memory", "256Gi"}, {"pods", "110"}}}}}};
}

nlohmann::json gpu_pod(const std::string& name, int gpus) {
  return {{"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", "uid-" + name}}},
          {"spec",
           {{"schedulerName", "tessera"},
            {"containers",
             {{{"name", "main"}, {"resources", {{"limits", {{"nvidia.com/gpu", gpus}}}}}}}}}},
          {"status", {{"phase", "Pending"}}}};
}

// The bind verb's answer: "" when bound, else the reason.
std::string bind(Extender& extender, const std::string& pod, const std::string& node,
                 const std::string& uid = "") {
  const HttpReply reply = extender.bind(nlohmann::json{
      {"PodName", pod},
      {"PodNamespace", "ml"},
      {"PodUID", uid.empty() ? "uid-" + pod : uid},
      {"Node", node}}.dump());
  EXPECT_EQ(reply.status, 200) << reply.body;
  return nlohmann::json::parse(reply.body).at("Error").get<std::string>();
}

std::string assignment_of(const test::InMemoryCluster& cluster, const std::string& pod) {
  const auto object = cluster.get("pods", "ml/" + pod);
  if (!object) return "";
  return (*object)["metadata"]
      .value("annotations", nlohmann::json::object())
      .value(contract::kAssignmentAnnotation, "");
}

// An extender on `cluster`, synced: it knows node gpu-a (2 GPUs) and the pods there are.
template <typename Cluster>
std::unique_ptr<Extender> extender_on(Cluster*& cluster_out) {
  auto cluster = std::make_unique<Cluster>();
  cluster->put("nodes", gpu_node("gpu-a", 2));
  cluster_out = cluster.get();
  auto extender = std::make_unique<Extender>(sched::Policy::best_fit, std::move(cluster));
  const base::Status synced = extender->sync();
  EXPECT_TRUE(synced.ok()) << synced.message();
  return extender;
}

TEST(ExtenderBind, ABindRecordsTheAssignmentThenBindsAndHoldsTheRoom) {
  test::InMemoryCluster* cluster = nullptr;
  const auto extender = extender_on(cluster);
  cluster->put("pods", gpu_pod("p1", 2));
  EXPECT_EQ(bind(*extender, "p1", "gpu-a"), "");
  const auto bound = cluster->get("pods", "ml/p1");
  EXPECT_EQ((*bound)["spec"]["nodeName"], "gpu-a");
  const auto record = nlohmann::json::parse(assignment_of(*cluster, "p1"));
  EXPECT_EQ(record["node"], "gpu-a");
  EXPECT_EQ(record["gpus"], nlohmann::json::array({0, 1}));
  // Both GPUs are held: the next pod does not fit, and is neither recorded nor bound.
  cluster->put("pods", gpu_pod("p2", 1));
  EXPECT_NE(bind(*extender, "p2", "gpu-a").find("no longer fits node gpu-a"), std::string::npos);
  EXPECT_EQ(assignment_of(*cluster, "p2"), "");
  EXPECT_FALSE((*cluster->get("pods", "ml/p2"))["spec"].contains("nodeName"));
}

TEST(ExtenderBind, APodThatIsAnotherPodNowOrBoundAlreadyIsLeftAsItIs) {
  test::InMemoryCluster* cluster = nullptr;
  const auto extender = extender_on(cluster);
  cluster->put("pods", gpu_pod("p1", 1));
  EXPECT_NE(bind(*extender, "p1", "gpu-a", "uid-of-an-older-p1").find("is now another pod"),
            std::string::npos);
  nlohmann::json bound = gpu_pod("p2", 1);
  bound["spec"]["nodeName"] = "gpu-b";
  cluster->put("pods", bound);
  EXPECT_NE(bind(*extender, "p2", "gpu-a").find("is bound to gpu-b already"), std::string::npos);
  EXPECT_NE(bind(*extender, "gone", "gpu-a").find("cannot read pod ml/gone: HTTP 404"),
            std::string::npos);
  // None of them holds room: two one-GPU pods still fit.
  cluster->put("pods", gpu_pod("p3", 1));
  cluster->put("pods", gpu_pod("p4", 1));
  EXPECT_EQ(bind(*extender, "p3", "gpu-a"), "");
  EXPECT_EQ(bind(*extender, "p4", "gpu-a"), "");
}

TEST(ExtenderBind, ARecordThatCannotBeWrittenGivesTheRoomBack) {
  test::InMemoryCluster* cluster = nullptr;
  const auto extender = extender_on(cluster);
  cluster->put("pods", gpu_pod("p1", 2));
  cluster->fail_writes_with(0);  // the API server stopped answering after the read
  EXPECT_NE(bind(*extender, "p1", "gpu-a").find("recording the assignment on pod ml/p1 failed"),
            std::string::npos);
  cluster->fail_writes_with(200);
  EXPECT_EQ(bind(*extender, "p1", "gpu-a"), "");  // the room was given back
}

// An API server that refuses every binding, as it does a pod bound by another scheduler
// between the extender's read and its bind.
class RefusingBindings : public test::InMemoryCluster {
 public:
  kube::ApiResponse bind_pod(const kube::ObjectName&, const std::string&, const std::string&,
                             kube::Deadline) const override {
    return {409, R"({"kind":"Status","code":409,"reason":"Conflict"})", {}};
  }
};

TEST(ExtenderBind, AFailedBindTakesItsRecordOffThePodAndGivesTheRoomBack) {
  RefusingBindings* cluster = nullptr;
  const auto extender = extender_on(cluster);
  cluster->put("pods", gpu_pod("p1", 2));
  cluster->put("pods", gpu_pod("p2", 2));
  EXPECT_NE(bind(*extender, "p1", "gpu-a").find("binding ml/p1 to gpu-a failed: HTTP 409"),
            std::string::npos);
  EXPECT_EQ(assignment_of(*cluster, "p1"), "");
  // p1's room is free again: p2 would fit, and fails only at its binding.
  EXPECT_NE(bind(*extender, "p2", "gpu-a").find("binding ml/p2 to gpu-a failed"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::extender
