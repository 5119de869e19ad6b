// tessera scheduler as kube-scheduler meets it: real HTTP, request bodies in the shape
// kube-scheduler sends, and a fake API server on loopback answering with recorded responses.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "support.h"

namespace tessera::test {
namespace {

std::string fixture(const std::string& name) {
  std::ifstream input(std::string(TESSERA_SOURCE_DIR) + "/tests/data/kube/" + name);
  std::stringstream text;
  text << input.rdbuf();
  return text.str();
}

// An API server that answers from recorded responses and remembers what it was asked. Lists
// come from the recordings; watches stream the events a test pushes.
class FakeApiServer {
 public:
  FakeApiServer() {
    for (const std::string resource : {"nodes", "pods"}) {
      server_.Get("/api/v1/" + resource,
                  [this, resource](const httplib::Request& request, httplib::Response& response) {
                    if (!request.has_param("watch")) {
                      ++lists[resource];
                      response.set_content(fixture(resource + ".json"), "application/json");
                      return;
                    }
                    response.set_chunked_content_provider(
                        "application/json", [this, resource](std::size_t, httplib::DataSink& sink) {
                          std::unique_lock<std::mutex> locked(mutex_);
                          // Wakes for an event or, now and then, to notice the server stopping.
                          events_changed_.wait_for(locked, std::chrono::milliseconds(100),
                                                   [&] { return !events_[resource].empty(); });
                          while (!events_[resource].empty()) {
                            const std::string line = events_[resource].front() + "\n";
                            events_[resource].pop_front();
                            if (!sink.write(line.data(), line.size())) return false;
                          }
                          return !stopping_.load();
                        });
                  });
    }
    server_.Patch(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+))",
                  [this](const httplib::Request& request, httplib::Response& response) {
                    remember("PATCH " + request.path, request.body);
                    response.set_content(R"({"kind":"Pod","apiVersion":"v1"})", "application/json");
                  });
    server_.Post(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding)",
                 [this](const httplib::Request& request, httplib::Response& response) {
                   remember("POST " + request.path, request.body);
                   std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
                   if (failures.load() > 0) {
                     --failures;
                     response.status = 503;
                     response.set_content(fixture("unavailable.json"), "application/json");
                     return;
                   }
                   response.status = 201;
                   response.set_content(fixture("binding-created.json"), "application/json");
                 });
    port_ = server_.bind_to_any_port("127.0.0.1");
    // Bound already: connections wait in the listen backlog until the thread accepts them.
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeApiServer() {
    stopping_ = true;
    server_.stop();
    thread_.join();
  }
  // Sends `event` (one watch event as JSON) to whoever watches `resource`.
  void push(const std::string& resource, const nlohmann::json& event) {
    std::lock_guard<std::mutex> locked(mutex_);
    events_[resource].push_back(event.dump());
    events_changed_.notify_all();
  }
  std::map<std::string, std::atomic<int>> lists;  // how often each was listed
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::pair<std::string, std::string>> calls() {
    std::lock_guard<std::mutex> locked(mutex_);
    return calls_;
  }
  std::atomic<int> failures{0};
  std::atomic<int> delay_ms{0};

 private:
  void remember(const std::string& what, const std::string& body) {
    std::lock_guard<std::mutex> locked(mutex_);
    calls_.emplace_back(what, body);
  }
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mutex_;
  std::condition_variable events_changed_;
  std::map<std::string, std::deque<std::string>> events_;
  std::atomic<bool> stopping_{false};
  std::vector<std::pair<std::string, std::string>> calls_;
};

class Extender : public ::testing::Test {
 protected:
  void SetUp() override {
    scheduler_ = std::make_unique<Running>(
        std::vector<std::string>{tessera(), "scheduler", "--listen", "127.0.0.1:0", "--api-server",
                                 api_.url(), "--timeout-ms", "300", "--policy", "best-fit"},
        Environment{});
    const std::string line = scheduler_->read_line();
    const auto colon = line.rfind(':');
    ASSERT_NE(colon, std::string::npos) << line;
    port_ = std::stoi(line.substr(colon + 1));
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
  }
  void TearDown() override {
    kill(scheduler_->pid(), SIGTERM);
    EXPECT_EQ(scheduler_->wait(), 0);
  }

  nlohmann::json post(const std::string& verb, const nlohmann::json& body,
                      int expected_status = 200) {
    auto result = client_->Post("/" + verb, body.dump(), "application/json");
    EXPECT_TRUE(result) << verb;
    if (!result) return {};
    EXPECT_EQ(result->status, expected_status) << result->body;
    return nlohmann::json::parse(result->body);
  }

  static nlohmann::json pod(const std::string& name, const nlohmann::json& limits) {
    return {{"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", "uid-" + name}}},
            {"spec",
             {{"containers",
               {{{"name", "c"},
                 {"resources",
                  {{"requests", {{"cpu", "2"}, {"memory", "8Gi"}}}, {"limits", limits}}}}}}}}};
  }
  static nlohmann::json nodes(const std::vector<std::string>& names) {
    nlohmann::json items = nlohmann::json::array();
    const nlohmann::json recorded = nlohmann::json::parse(fixture("nodes.json"));
    for (const auto& node : recorded["items"]) {
      for (const auto& name : names) {
        if (node["metadata"]["name"] == name) items.push_back(node);
      }
    }
    return {{"metadata", nlohmann::json::object()}, {"items", items}};
  }
  nlohmann::json bind(const std::string& name, const std::string& node) {
    return post(
        "bind",
        {{"PodName", name}, {"PodNamespace", "ml"}, {"PodUID", "uid-" + name}, {"Node", node}});
  }

  FakeApiServer api_;
  std::unique_ptr<Running> scheduler_;
  std::unique_ptr<httplib::Client> client_;
  int port_ = 0;
};

TEST_F(Extender, FilterAnswersInKubeSchedulersShapeWithReasons) {
  // 20 GiB of GPU memory: half an A100-40GB, more than a T4 has.
  const auto result =
      post("filter", {{"Pod", pod("p1", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "20480"}})},
                      {"Nodes", nodes({"gpu-a", "gpu-b", "cpu-1"})},
                      {"NodeNames", nullptr}});
  ASSERT_EQ(result["Nodes"]["items"].size(), 1u) << result.dump();
  EXPECT_EQ(result["Nodes"]["items"][0]["metadata"]["name"], "gpu-a");
  EXPECT_EQ(result["Error"], "");
  EXPECT_NE(result["FailedNodes"]["gpu-b"].get<std::string>().find(
                "20480 MiB of GPU memory; a GPU here has 15360"),
            std::string::npos);
  EXPECT_NE(result["FailedNodes"]["cpu-1"].get<std::string>().find("no GPUs"), std::string::npos);
}

TEST_F(Extender, NodeCacheCapableFilteringUsesTheListedNodesAndTheirPods) {
  // gpu-a already holds serve-0 (500 milli on GPU 0); done-0 on gpu-c has finished.
  const auto whole_two = post("filter", {{"Pod", pod("p2", {{"nvidia.com/gpu", "2"}})},
                                         {"NodeNames", {"gpu-a", "gpu-c", "nowhere"}}});
  EXPECT_EQ(whole_two["NodeNames"], nlohmann::json::array({"gpu-c"}));
  EXPECT_NE(whole_two["FailedNodes"]["gpu-a"].get<std::string>().find("no room for 2 GPU(s)"),
            std::string::npos);
  EXPECT_EQ(whole_two["FailedNodes"]["nowhere"], "node unknown to Tessera");
}

// Polls until `met` holds, for at most five seconds: watches deliver asynchronously.
template <typename Condition>
bool eventually(Condition met) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!met()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

TEST_F(Extender, WatchedPodsAndNodesTakeAndGiveRoomAsTheyComeAndGo) {
  const nlohmann::json two_gpus = pod("p7", {{"nvidia.com/gpu", "2"}});
  auto passes = [&](const std::string& node) {
    const auto result = post("filter", {{"Pod", two_gpus}, {"NodeNames", {node}}});
    return result["NodeNames"] == nlohmann::json::array({node});
  };
  ASSERT_TRUE(passes("gpu-c"));
  nlohmann::json trainer = nlohmann::json::parse(fixture("pods.json"))["items"][1];
  trainer["metadata"]["uid"] = "uid-trainer";
  trainer["metadata"]["resourceVersion"] = "48300";
  trainer["status"]["phase"] = "Running";  // a pod placed on gpu-c's two GPUs, running
  api_.push("pods", {{"type", "ADDED"}, {"object", trainer}});
  EXPECT_TRUE(eventually([&] { return !passes("gpu-c"); })) << "the new pod's GPUs stayed free";
  api_.push("pods", {{"type", "DELETED"}, {"object", trainer}});
  EXPECT_TRUE(eventually([&] { return passes("gpu-c"); })) << "the deleted pod's GPUs stayed taken";

  nlohmann::json added = nlohmann::json::parse(fixture("nodes.json"))["items"][2];  // like gpu-c
  added["metadata"]["name"] = "gpu-d";
  EXPECT_FALSE(passes("gpu-d"));  // unknown so far
  api_.push("nodes", {{"type", "ADDED"}, {"object", added}});
  EXPECT_TRUE(eventually([&] { return passes("gpu-d"); })) << "the new node stayed unknown";
  api_.push("nodes", {{"type", "DELETED"}, {"object", added}});
  EXPECT_TRUE(eventually([&] { return !passes("gpu-d"); })) << "the deleted node stayed";
}

TEST_F(Extender, AWatchWhoseVersionExpiredListsAgain) {
  // Listed once at start and once by the pods' watcher before it watches.
  ASSERT_TRUE(eventually([&] { return api_.lists["pods"] >= 2; }));
  const int before = api_.lists["pods"];
  api_.push("pods", {{"type", "ERROR"},
                     {"object",
                      {{"kind", "Status"},
                       {"status", "Failure"},
                       {"reason", "Expired"},
                       {"code", 410},
                       {"message", "too old resource version: 48220 (48990)"}}}});
  EXPECT_TRUE(eventually([&] { return api_.lists["pods"] > before; }));
}

TEST_F(Extender, AnUnreadableWatchEventListsAgainRatherThanGuess) {
  // Listed once at start and once by the pods' watcher before it watches.
  ASSERT_TRUE(eventually([&] { return api_.lists["pods"] >= 2; }));
  const int before = api_.lists["pods"];
  api_.push("pods", {{"type", "MODIFIED"}, {"object", {{"metadata", 42}}}});
  EXPECT_TRUE(eventually([&] { return api_.lists["pods"] > before; }));
}

TEST_F(Extender, PrioritizeScoresZeroToTenByPolicy) {
  // best-fit: the partly used gpu-a before the empty gpu-c.
  const auto result = post(
      "prioritize", {{"Pod", pod("p3", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}})},
                     {"NodeNames", {"gpu-a", "gpu-c"}}});
  ASSERT_EQ(result.size(), 2u);
  std::map<std::string, int> scores;
  for (const auto& entry : result) scores[entry["Host"]] = entry["Score"];
  EXPECT_EQ(scores["gpu-a"], 10);
  EXPECT_EQ(scores["gpu-c"], 0);
}

TEST_F(Extender, BindRecordsTheGpusOnThePodAndCreatesTheBinding) {
  post("filter", {{"Pod", pod("p4", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "20480"}})},
                  {"NodeNames", {"gpu-a"}}});
  EXPECT_EQ(bind("p4", "gpu-a")["Error"], "");
  const auto calls = api_.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].first, "PATCH /api/v1/namespaces/ml/pods/p4");
  const auto annotation = nlohmann::json::parse(
      nlohmann::json::parse(calls[0].second)["metadata"]["annotations"]["tessera.io/assignment"]
          .get<std::string>());
  EXPECT_EQ(annotation["node"], "gpu-a");
  EXPECT_EQ(annotation["gpus"], nlohmann::json::array({0}));  // the tightest GPU: next to serve-0
  EXPECT_EQ(annotation["milli"], 500);
  EXPECT_EQ(calls[1].first, "POST /api/v1/namespaces/ml/pods/p4/binding");
  const auto binding = nlohmann::json::parse(calls[1].second);
  EXPECT_EQ(binding["kind"], "Binding");
  EXPECT_EQ(binding["target"],
            (nlohmann::json{{"apiVersion", "v1"}, {"kind", "Node"}, {"name", "gpu-a"}}));
  EXPECT_EQ(binding["metadata"]["name"], "p4");
  // gpu-a's GPU 0 is now full: a whole-GPU pod takes GPU 1, the next finds no room.
  post("filter", {{"Pod", pod("p5", {{"nvidia.com/gpu", "1"}})}, {"NodeNames", {"gpu-a"}}});
  post("filter", {{"Pod", pod("p6", {{"nvidia.com/gpu", "1"}})}, {"NodeNames", {"gpu-a"}}});
  EXPECT_EQ(bind("p5", "gpu-a")["Error"], "");
  EXPECT_NE(bind("p6", "gpu-a")["Error"].get<std::string>().find("no longer fits node gpu-a"),
            std::string::npos);
}

TEST_F(Extender, ConcurrentBindsNeverOverbookANode) {
  // gpu-c has two free GPUs; eight whole-GPU pods race for them.
  for (int i = 0; i < 8; ++i) {
    post("filter", {{"Pod", pod("r" + std::to_string(i), {{"nvidia.com/gpu", "1"}})},
                    {"NodeNames", {"gpu-c"}}});
  }
  std::atomic<int> bound{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", port_);
      const nlohmann::json body{{"PodName", "r" + std::to_string(i)},
                                {"PodNamespace", "ml"},
                                {"PodUID", "uid-r" + std::to_string(i)},
                                {"Node", "gpu-c"}};
      auto result = client.Post("/bind", body.dump(), "application/json");
      if (result && nlohmann::json::parse(result->body)["Error"] == "") {
        ++bound;
      } else {
        ++refused;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(bound.load(), 2);
  EXPECT_EQ(refused.load(), 6);
}

TEST_F(Extender, TheApiClientRetriesAndTimesOut) {
  post("filter", {{"Pod", pod("p7", {{"nvidia.com/gpu", "1"}})}, {"NodeNames", {"gpu-c"}}});
  api_.failures = 1;  // a 503 first, then the binding is created
  EXPECT_EQ(bind("p7", "gpu-c")["Error"], "");
  int binding_posts = 0;
  for (const auto& call : api_.calls())
    binding_posts += call.first.find("/binding") != std::string::npos;
  EXPECT_EQ(binding_posts, 2);

  post("filter", {{"Pod", pod("p8", {{"nvidia.com/gpu", "1"}})}, {"NodeNames", {"gpu-c"}}});
  api_.delay_ms = 700;  // longer than the 300 ms timeout, on every attempt
  const std::string error = bind("p8", "gpu-c")["Error"];
  EXPECT_NE(error.find("binding ml/p8 to gpu-c failed"), std::string::npos) << error;
  EXPECT_NE(error.find("imeout"), std::string::npos) << error;
  api_.delay_ms = 0;
  // The failed bind gave its GPU back: another pod still fits the last free GPU.
  post("filter", {{"Pod", pod("p9", {{"nvidia.com/gpu", "1"}})}, {"NodeNames", {"gpu-c"}}});
  EXPECT_EQ(bind("p9", "gpu-c")["Error"], "");
}

TEST_F(Extender, MalformedBodiesAreRefusedWithHttp400AndAReason) {
  struct Case {
    std::string verb, body, expected;
  } cases[] = {
      {"filter", "not json", "the body is not JSON"},
      {"filter", "{}", "ExtenderArgs has no Pod object"},
      {"filter", R"({"Pod": {"metadata": {"name": "x"}}})", "neither Nodes nor NodeNames"},
      {"prioritize", R"({"Pod": {"metadata": {"name": "x"}}, "NodeNames": [1]})", "non-string"},
      {"filter",
       R"({"Pod": {"metadata": {"name": "x"}, "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "lots"}}}]}}, "NodeNames": []})",
       "pod default/x: limits.nvidia.com/gpu="},
      {"filter",
       R"({"Pod": {"metadata": {"name": "x"}}, "Nodes": {"items": [{"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "many"}}}]}})",
       "node n: status.allocatable.cpu='many' is not a quantity"},
      {"bind", R"({"PodName": "x", "PodNamespace": "ml", "Node": "gpu-a"})",
       "ExtenderBindingArgs.PodUID is missing"},
  };
  for (const Case& c : cases) {
    auto result = client_->Post("/" + c.verb, c.body, "application/json");
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 400) << c.body;
    EXPECT_NE(result->body.find(c.expected), std::string::npos) << c.body << " -> " << result->body;
  }
}

}  // namespace
}  // namespace tessera::test
