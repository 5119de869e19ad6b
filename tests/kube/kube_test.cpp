// The Kubernetes client's own parts: connection settings in and out of a cluster, and the
// reflector's reading of lists and watch events, against a real HTTP server.
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fake_cluster.h"
#include "kube/api_client.h"
#include "kube/api_cluster.h"
#include "kube/lease.h"
#include "kube/objects.h"
#include "kube/reflector.h"
#include "support.h"

namespace tessera::kube {
namespace {

using test::ScratchDirectory;

// Sets or clears an environment variable for one test, and puts it back after.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old, had_ = true;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedVariable() {
    if (had_) {
      setenv(name_, saved_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

std::string write(const ScratchDirectory& scratch, const std::string& name,
                  const std::string& text) {
  const std::string path = scratch.file(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(KubeClient, OutsideAClusterAServerMustBeGiven) {
  ScopedVariable host("KUBERNETES_SERVICE_HOST", nullptr);
  ApiClientOptions options;
  const base::Status refused = client_options({}, options);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("KUBERNETES_SERVICE_HOST"), std::string::npos)
      << refused.message();
  EXPECT_TRUE(client_options({.server = "http://127.0.0.1:8080"}, options).ok());
  EXPECT_EQ(options.server, "http://127.0.0.1:8080");
  EXPECT_TRUE(options.token.empty());
}

TEST(KubeClient, InAClusterTheServiceAndItsAccountAreUsed) {
  ScratchDirectory scratch;
  ScopedVariable host("KUBERNETES_SERVICE_HOST", "10.96.0.1");
  ScopedVariable port("KUBERNETES_SERVICE_PORT", "443");
  ApiClientOptions options;
  const std::string token = write(scratch, "token", "eyJhbGciOi.abc.def\n");
  const base::Status configured =
      client_options({.token_file = token, .ca_file = "/ca.crt"}, options);
  ASSERT_TRUE(configured.ok()) << configured.message();
  EXPECT_EQ(options.server, "https://10.96.0.1:443");
  EXPECT_EQ(options.token, "eyJhbGciOi.abc.def");  // without its line break
  EXPECT_EQ(options.ca_file, "/ca.crt");
  ScopedVariable v6("KUBERNETES_SERVICE_HOST", "fd00::1");
  ASSERT_TRUE(client_options({.token_file = token}, options).ok());
  EXPECT_EQ(options.server, "https://[fd00::1]:443");
  EXPECT_EQ(options.ca_file, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt");
}

TEST(KubeClient, ATokenFileThatIsNoTokenIsRefusedWithItsPath) {
  ScratchDirectory scratch;
  const struct {
    std::string name, content, expected;
  } cases[] = {{"two-lines", "abc\nX-Injected: 1\n", "more than one line"},
               {"huge", std::string(100 << 10, 'a'), "larger than any token"}};
  for (const auto& c : cases) {
    const std::string path = write(scratch, c.name, c.content);
    ApiClientOptions options;
    const base::Status refused =
        client_options({.server = "http://127.0.0.1:1", .token_file = path}, options);
    EXPECT_FALSE(refused.ok());
    EXPECT_NE(refused.message().find(c.expected), std::string::npos) << refused.message();
    EXPECT_NE(refused.message().find(path), std::string::npos) << refused.message();
  }
  ApiClientOptions options;
  const base::Status refused =
      client_options({.server = "http://127.0.0.1:1", .token_file = scratch.file("none")}, options);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find(scratch.file("none")), std::string::npos) << refused.message();
}

// What a reflector handed to the collection's owner.
struct Seen {
  std::vector<std::string> calls;
  bool refuse = false;
  CollectionHandlers handlers() {
    return {[this](const nlohmann::json& items) { calls.push_back("list " + items.dump()); },
            [this](std::string_view type, const nlohmann::json& object) {
              if (refuse) throw std::runtime_error("the owner cannot use it");
              calls.push_back(std::string(type) + " " + object.value("name", ""));
            }};
  }
};

TEST(KubeReflector, EachWatchLineIsAppliedOrEndsTheWatchWithAReason) {
  Seen seen;
  std::string version = "1", why;
  EXPECT_EQ(apply_watch_line(R"({"type":"ADDED","object":{"name":"a","metadata":
              {"resourceVersion":"5"}}})",
                             seen.handlers(), version, why),
            WatchEnd::not_yet);
  EXPECT_EQ(version, "5");
  EXPECT_EQ(apply_watch_line(R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}})",
                             seen.handlers(), version, why),
            WatchEnd::not_yet);
  EXPECT_EQ(version, "9");  // a bookmark moves the version and applies nothing
  EXPECT_EQ(seen.calls, std::vector<std::string>{"ADDED a"});
  EXPECT_EQ(
      apply_watch_line(R"({"type":"ERROR","object":{"code":410}})", seen.handlers(), version, why),
      WatchEnd::expired);
  const struct {
    std::string line, expected;
  } broken[] = {{"not json", "cannot be read"},
                {R"({"object":{}})", "without a type"},
                {R"({"type":"ADDED","object":3})", "without an object"},
                {R"({"type":"RENAMED","object":{}})", "unknown type"},
                {R"({"type":"ERROR","object":{"code":500}})", "the API server sent"},
                {std::string(100, '[') + std::string(100, ']'), "cannot be read"}};
  for (const auto& c : broken) {
    why.clear();
    EXPECT_EQ(apply_watch_line(c.line, seen.handlers(), version, why), WatchEnd::broken) << c.line;
    EXPECT_NE(why.find(c.expected), std::string::npos) << c.line << ": " << why;
  }
  seen.refuse = true;
  EXPECT_EQ(apply_watch_line(R"({"type":"MODIFIED","object":{"name":"a"}})", seen.handlers(),
                             version, why),
            WatchEnd::broken);
  EXPECT_EQ(why, "the owner cannot use it");
}

TEST(KubeReflector, AListIsHandedOverWholeOrRefusedWithAReason) {
  httplib::Server server;
  std::string answer = R"({"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[1,2]})";
  int status = 200;
  server.Get("/api/v1/pods", [&](const httplib::Request&, httplib::Response& response) {
    response.status = status;
    response.set_content(answer, "application/json");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread serving([&] { server.listen_after_bind(); });  // bound: connections queue
  const ApiCluster api({.server = "http://127.0.0.1:" + std::to_string(port), .attempts = 1});
  Seen seen;
  std::string version;
  const base::Status listed =
      list_collection(api, Collection::all_pods(), seen.handlers(), version);
  EXPECT_TRUE(listed.ok()) << listed.message();
  EXPECT_EQ(version, "7");
  EXPECT_EQ(seen.calls, std::vector<std::string>{"list [1,2]"});
  answer = R"({"kind":"PodList","items":{}})";
  const base::Status malformed =
      list_collection(api, Collection::all_pods(), seen.handlers(), version);
  EXPECT_NE(malformed.message().find("no items array"), std::string::npos) << malformed.message();
  status = 403;
  const base::Status forbidden =
      list_collection(api, Collection::all_pods(), seen.handlers(), version);
  EXPECT_NE(forbidden.message().find("HTTP 403"), std::string::npos) << forbidden.message();
  EXPECT_EQ(seen.calls.size(), 1u);  // nothing more was handed over
  server.stop();
  serving.join();
}

}  // namespace
}  // namespace tessera::kube

namespace tessera::kube {
namespace {

LeaseSettings lease_for(const std::string& identity) {
  LeaseSettings settings;
  settings.identity = identity;
  settings.duration = std::chrono::seconds(2);
  settings.renew_deadline = std::chrono::milliseconds(1000);
  settings.retry_period = std::chrono::milliseconds(100);
  return settings;
}

TEST(Lease, ARenewedLeaseIsNeverTakenAndAReleasedOneIsTakenAtOnce) {
  test::FakeCluster cluster;
  const ApiCluster api({.server = cluster.url()});
  LeaderElector first(api, lease_for("first")), second(api, lease_for("second"));
  ASSERT_TRUE(first.try_acquire_or_renew());
  // Past the lease's duration, as long as the holder renews, the other never takes it.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(first.try_acquire_or_renew());
    ASSERT_FALSE(second.try_acquire_or_renew());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the retry period
  }
  first.release();
  EXPECT_EQ((*cluster.get("leases", "kube-system/tessera-scheduler"))["spec"]["holderIdentity"],
            "");
  EXPECT_TRUE(second.try_acquire_or_renew());
  EXPECT_FALSE(first.try_acquire_or_renew());
}

TEST(Lease, OfManyRacingForAFreeLeaseExactlyOneTakesIt) {
  test::FakeCluster cluster;
  const ApiCluster api({.server = cluster.url()});
  std::vector<std::unique_ptr<LeaderElector>> electors;
  for (int i = 0; i < 8; ++i) {
    electors.push_back(std::make_unique<LeaderElector>(api, lease_for("r" + std::to_string(i))));
  }
  std::atomic<int> holders{0};
  std::vector<std::thread> racing;
  for (auto& elector : electors) {
    racing.emplace_back([&, e = elector.get()] { holders += e->try_acquire_or_renew() ? 1 : 0; });
  }
  for (auto& thread : racing) thread.join();
  EXPECT_EQ(holders.load(), 1);
}

TEST(Lease, FollowingLeadsWhileTheHolderIsThisReplicaAndReportsAnUnreadableLease) {
  test::FakeCluster cluster;
  const ApiCluster api({.server = cluster.url()});
  auto follower = [&](const std::string& identity) {
    LeaseSettings settings = lease_for(identity);
    settings.follow = true;
    settings.name = "kube-scheduler";
    return settings;
  };
  nlohmann::json lease{{"metadata", {{"name", "kube-scheduler"}, {"namespace", "kube-system"}}},
                       {"spec",
                        {{"holderIdentity", "pod-a_5c2f"},
                         {"leaseDurationSeconds", 2},
                         {"renewTime", "2026-12-05T10:00:00.000000Z"}}}};
  cluster.put("leases", lease);
  std::vector<std::string> said;
  LeaderElector same(api, follower("pod-a")), other(api, follower("pod-b")),
      prefix(api, follower("pod"));
  EXPECT_TRUE(same.try_acquire_or_renew());
  EXPECT_FALSE(other.try_acquire_or_renew());
  EXPECT_FALSE(prefix.try_acquire_or_renew());
  // A follower never writes the Lease.
  EXPECT_EQ((*cluster.get("leases", "kube-system/kube-scheduler"))["spec"]["holderIdentity"],
            "pod-a_5c2f");
  lease["spec"]["leaseDurationSeconds"] = "forever";
  cluster.put("leases", lease);
  LeaderElector reading(api, follower("pod-a"),
                        [&](const std::string& line) { said.push_back(line); });
  EXPECT_FALSE(reading.try_acquire_or_renew());
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("leaseDurationSeconds is not an integer"), std::string::npos) << said[0];
}

// The extender frees a finished pod's GPUs and the node agent steers no device toward it: one
// reading of the phase for both.
TEST(KubeObjects, APodHasFinishedOnlyWhenItsPhaseSaysSucceededOrFailed) {
  for (const char* phase : {"Succeeded", "Failed"}) {
    EXPECT_TRUE(pod_finished(nlohmann::json{{"status", {{"phase", phase}}}})) << phase;
  }
  for (const char* phase : {"Pending", "Running", "Unknown", "succeeded"}) {
    EXPECT_FALSE(pod_finished(nlohmann::json{{"status", {{"phase", phase}}}})) << phase;
  }
  EXPECT_FALSE(pod_finished(nlohmann::json{{"status", {{"phase", 3}}}})) << "not a string";
  EXPECT_FALSE(pod_finished(nlohmann::json::array())) << "not an object";
}

}  // namespace
}  // namespace tessera::kube
