// The Cluster facade's callers on the in-memory API: a collection followed through its list
// and watch, and Leases taken, refused and given up. No HTTP: the paths are ApiCluster's,
// tested in kube_test against a server.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kube/lease.h"
#include "kube/reflector.h"
#include "memory_cluster.h"

namespace tessera::kube {
namespace {

using namespace std::chrono_literals;

nlohmann::json pod_on(const std::string& name, const std::string& node) {
  return {{"metadata", {{"name", name}, {"namespace", "ml"}}}, {"spec", {{"nodeName", node}}}};
}

// What a follower was told, in order, and a way to wait for it.
class Told {
 public:
  CollectionHandlers handlers() {
    return {[this](const nlohmann::json& items) {
              std::vector<std::string> names;
              for (const auto& item : items) names.push_back(item["metadata"]["name"]);
              add("list " + nlohmann::json(names).dump());
            },
            [this](std::string_view type, const nlohmann::json& object) {
              add(std::string(type) + " " + object["metadata"]["name"].get<std::string>());
            }};
  }
  // Waits until `count` things were told (or 10 s pass); what they were.
  std::vector<std::string> wait_for(std::size_t count) {
    std::unique_lock<std::mutex> locked(mutex_);
    changed_.wait_for(locked, 10s, [&] { return lines_.size() >= count; });
    return lines_;
  }

 private:
  void add(std::string line) {
    std::lock_guard<std::mutex> locked(mutex_);
    lines_.push_back(std::move(line));
    changed_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> lines_;
};

TEST(KubeCluster, AFollowedCollectionIsListedThenWatchedAndHoldsOnlyItsOwnObjects) {
  test::InMemoryCluster cluster;
  cluster.put("pods", pod_on("here-1", "n1"));
  cluster.put("pods", pod_on("there", "n2"));
  Told told;
  std::atomic<bool> stop{false};
  std::thread following([&] {
    follow_collection(cluster, Collection::pods_on_node("n1"), told.handlers(), stop, {});
  });
  ASSERT_EQ(told.wait_for(1), std::vector<std::string>{R"(list ["here-1"])"});
  cluster.put("pods", pod_on("elsewhere", "n3"));  // not this collection's: never told
  cluster.put("pods", pod_on("here-2", "n1"));
  cluster.patch("pods", "ml/here-1", {{"metadata", {{"labels", {{"a", "b"}}}}}});
  cluster.remove("pods", "ml/here-2");
  const std::vector<std::string> expected{R"(list ["here-1"])", "ADDED here-2", "MODIFIED here-1",
                                          "DELETED here-2"};
  EXPECT_EQ(told.wait_for(4), expected);
  stop = true;
  following.join();
  EXPECT_EQ(told.wait_for(0), expected);  // nothing after, nothing twice
}

TEST(KubeCluster, AListThatCannotBeReadIsRefusedWithTheCollectionNamed) {
  // An API server that answers every list with 403.
  class Forbidding : public test::InMemoryCluster {
    ApiResponse list(const Collection&, Deadline) const override { return {403, "{}", {}}; }
  } cluster;
  Told told;
  std::string version;
  const base::Status listed =
      list_collection(cluster, Collection::node_named("gpu-1"), told.handlers(), version);
  EXPECT_EQ(listed.message(), "listing node gpu-1 failed: HTTP 403 ");
}

LeaseSettings lease_for(const std::string& identity, bool follow = false) {
  LeaseSettings settings;
  settings.identity = identity;
  settings.follow = follow;
  return settings;  // the default periods: nothing here waits for them
}

TEST(KubeCluster, ALeaseIsTakenByOneReplicaAndHandedOverWhenReleased) {
  test::InMemoryCluster cluster;
  LeaderElector first(cluster, lease_for("first")), second(cluster, lease_for("second"));
  ASSERT_TRUE(first.try_acquire_or_renew());
  EXPECT_FALSE(second.try_acquire_or_renew());  // held and renewed: not expired
  ASSERT_TRUE(first.try_acquire_or_renew());    // renewed: one transition still
  const auto held = cluster.get("leases", "kube-system/tessera-scheduler");
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ((*held)["spec"]["holderIdentity"], "first");
  EXPECT_EQ((*held)["spec"]["leaseTransitions"], 0);
  first.release();
  EXPECT_EQ((*cluster.get("leases", "kube-system/tessera-scheduler"))["spec"]["holderIdentity"],
            "");
  EXPECT_TRUE(second.try_acquire_or_renew());
  EXPECT_EQ((*cluster.get("leases", "kube-system/tessera-scheduler"))["spec"]["leaseTransitions"],
            1);
  EXPECT_FALSE(first.try_acquire_or_renew());
}

TEST(KubeCluster, AReplicaThatCannotWriteTheLeaseNeverTakesItAndSaysWhyOnce) {
  test::InMemoryCluster cluster;
  cluster.fail_writes_with(500);
  std::vector<std::string> said;
  LeaderElector elector(cluster, lease_for("r1"),
                        [&](const std::string& line) { said.push_back(line); });
  EXPECT_FALSE(elector.try_acquire_or_renew());
  EXPECT_FALSE(elector.try_acquire_or_renew());
  ASSERT_EQ(said.size(), 1u);  // once per change of what fails
  EXPECT_NE(said[0].find("cannot create it: HTTP 500"), std::string::npos) << said[0];
  cluster.fail_writes_with(200);
  EXPECT_TRUE(elector.try_acquire_or_renew());
}

TEST(KubeCluster, AFollowerLeadsOnlyWhileItsPodHoldsTheLeaseAndNeverWritesIt) {
  test::InMemoryCluster cluster;
  cluster.put("leases",
              {{"metadata", {{"name", "kube-scheduler"}, {"namespace", "kube-system"}}},
               {"spec", {{"holderIdentity", "pod-a_5c2f"}, {"leaseDurationSeconds", 15}}}});
  auto follower = [](const std::string& identity) {
    LeaseSettings settings = lease_for(identity, true);
    settings.name = "kube-scheduler";
    return settings;
  };
  LeaderElector same(cluster, follower("pod-a")), other(cluster, follower("pod-b"));
  const auto before = cluster.get("leases", "kube-system/kube-scheduler");
  EXPECT_TRUE(same.try_acquire_or_renew());
  EXPECT_FALSE(other.try_acquire_or_renew());
  EXPECT_EQ(cluster.get("leases", "kube-system/kube-scheduler"), before);
  // No Lease at all: a follower does not create one, nor lead.
  cluster.remove("leases", "kube-system/kube-scheduler");
  LeaderElector fresh(cluster, follower("pod-a"));
  EXPECT_FALSE(fresh.try_acquire_or_renew());
  same.try_acquire_or_renew();  // leads on until its renew deadline, as a holder does
  EXPECT_FALSE(cluster.get("leases", "kube-system/kube-scheduler").has_value());
}

}  // namespace
}  // namespace tessera::kube
