// tessera scheduler as kube-scheduler meets it: real HTTP, request bodies in the shape
// kube-scheduler sends, and a fake API server on loopback answering with recorded responses.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "contract/annotations.h"
#include "kube/objects.h"
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
    // Both counters exist before any handler runs: handlers and the test then only find them.
    lists["nodes"] = 0;
    lists["pods"] = 0;
    for (const std::string resource : {"nodes", "pods"}) {
      server_.Get("/api/v1/" + resource, [this, resource](const httplib::Request& request,
                                                          httplib::Response& response) {
        if (!request.has_param("watch")) {
          ++lists.at(resource);
          nlohmann::json listed = nlohmann::json::parse(fixture(resource + ".json"));
          std::lock_guard<std::mutex> locked(mutex_);
          for (const std::string& item : extra_items_[resource]) {
            listed["items"].push_back(nlohmann::json::parse(item));
          }
          response.set_content(listed.dump(), "application/json");
          return;
        }
        if (expire_every_watch) {  // as an API server whose history is always too short
          response.set_content(R"({"type":"ERROR","object":{"kind":"Status","code":410}})"
                               "\n",
                               "application/json");
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
    server_.Get(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+))",
                [this](const httplib::Request& request, httplib::Response& response) {
                  std::unique_lock<std::mutex> locked(mutex_);
                  pod_reads_released_.wait(locked, [this] { return !hold_pod_reads_; });
                  const auto found = pods_.find(request.matches[2].str());
                  if (found == pods_.end()) {
                    response.status = 404;
                    response.set_content(R"({"kind":"Status","code":404})", "application/json");
                    return;
                  }
                  response.set_content(found->second, "application/json");
                });
    server_.Patch(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+))",
                  [this](const httplib::Request& request, httplib::Response& response) {
                    remember("PATCH " + request.path, request.body);
                    // A merge patch naming a version that is not the pod's is a conflict.
                    const auto patch = nlohmann::json::parse(request.body);
                    const auto version = patch["metadata"].value("resourceVersion", std::string());
                    std::string current;
                    {
                      std::lock_guard<std::mutex> locked(mutex_);
                      if (const auto found = pods_.find(request.matches[2].str());
                          found != pods_.end()) {
                        current = nlohmann::json::parse(found->second)["metadata"].value(
                            "resourceVersion", std::string());
                      }
                    }
                    if (!version.empty() && version != current) {
                      response.status = 409;
                      response.set_content(R"({"kind":"Status","code":409,"reason":"Conflict"})",
                                           "application/json");
                      return;
                    }
                    response.set_content(R"({"kind":"Pod","apiVersion":"v1"})", "application/json");
                  });
    server_.Patch(R"(/api/v1/nodes/([^/]+))", [this](const httplib::Request& request,
                                                     httplib::Response& response) {
      remember("PATCH " + request.path, request.body);
      response.set_content(R"({"kind":"Node","apiVersion":"v1"})", "application/json");
    });
    server_.Post(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding)",
                 [this](const httplib::Request& request, httplib::Response& response) {
                   remember("POST " + request.path, request.body);
                   std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
                   if (binding_conflict) {
                     response.status = 409;
                     response.set_content(R"({"kind":"Status","code":409,"reason":"Conflict"})",
                                          "application/json");
                     return;
                   }
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
    push_raw(resource, event.dump());
  }
  void push_raw(const std::string& resource, const std::string& line) {
    std::lock_guard<std::mutex> locked(mutex_);
    events_[resource].push_back(line);
    events_changed_.notify_all();
  }
  // A pod the API server holds (GET answers it); `listed`: lists show it too.
  void add_pod(const nlohmann::json& pod, bool listed = false) {
    std::lock_guard<std::mutex> locked(mutex_);
    pods_[pod["metadata"]["name"].get<std::string>()] = pod.dump();
    if (listed) extra_items_["pods"].push_back(pod.dump());
  }
  // A raw item for lists of `resource`, readable or not.
  void add_listed(const std::string& resource, const nlohmann::json& item) {
    std::lock_guard<std::mutex> locked(mutex_);
    extra_items_[resource].push_back(item.dump());
  }
  std::map<std::string, std::atomic<int>> lists;  // how often each was listed
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::pair<std::string, std::string>> calls() {
    std::lock_guard<std::mutex> locked(mutex_);
    return calls_;
  }
  std::atomic<int> failures{0};
  std::atomic<int> delay_ms{0};
  // Between these two, reads of one pod (a bind's first call) wait instead of answering.
  void hold_pod_reads() {
    std::lock_guard<std::mutex> locked(mutex_);
    hold_pod_reads_ = true;
  }
  void release_pod_reads() {
    {
      std::lock_guard<std::mutex> locked(mutex_);
      hold_pod_reads_ = false;
    }
    pod_reads_released_.notify_all();
  }
  std::atomic<bool> binding_conflict{false};
  std::atomic<bool> expire_every_watch{false};

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
  std::condition_variable pod_reads_released_;
  bool hold_pod_reads_ = false;  // guarded by mutex_
  std::map<std::string, std::deque<std::string>> events_;
  std::atomic<bool> stopping_{false};
  std::vector<std::pair<std::string, std::string>> calls_;
  std::map<std::string, std::string> pods_;                      // by name
  std::map<std::string, std::vector<std::string>> extra_items_;  // by resource
};

class Extender : public ::testing::Test {
 protected:
  void SetUp() override { start(); }
  void TearDown() override { stop(); }
  // `wrapper` runs before the scheduler's own arguments (e.g. a shell that closes stderr).
  void start(const std::vector<std::string>& wrapper = {}, int api_timeout_ms = 300) {
    std::vector<std::string> argv = wrapper;
    for (const std::string& argument :
         {tessera(), std::string("scheduler"), std::string("--listen"), std::string("127.0.0.1:0"),
          std::string("--api-server"), api_.url(), std::string("--timeout-ms"),
          std::to_string(api_timeout_ms), std::string("--policy"), std::string("best-fit")}) {
      argv.push_back(argument);
    }
    scheduler_ = std::make_unique<Running>(argv, Environment{});
    const std::string line = scheduler_->read_line();
    const auto colon = line.rfind(':');
    ASSERT_NE(colon, std::string::npos) << line;
    port_ = std::stoi(line.substr(colon + 1));
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
  }
  void stop() {
    kill(scheduler_->pid(), SIGTERM);
    EXPECT_EQ(scheduler_->wait(), 0) << "the scheduler did not end cleanly (crashed?)";
  }
  void restart() {
    stop();
    start();
  }

  nlohmann::json post(const std::string& verb, const nlohmann::json& body,
                      int expected_status = 200) {
    auto result = client_->Post("/" + verb, body.dump(), "application/json");
    EXPECT_TRUE(result) << verb;
    if (!result) return {};
    EXPECT_EQ(result->status, expected_status) << result->body;
    return nlohmann::json::parse(result->body);
  }

  // A pending pod, which the API server holds from now on.
  nlohmann::json pod(const std::string& name, const nlohmann::json& limits,
                     const std::string& cpu = "2") {
    nlohmann::json object{
        {"metadata",
         {{"name", name}, {"namespace", "ml"}, {"uid", "uid-" + name}, {"resourceVersion", "7"}}},
        {"spec",
         {{"containers",
           {{{"name", "c"},
             {"resources",
              {{"requests", {{"cpu", cpu}, {"memory", "8Gi"}}}, {"limits", limits}}}}}}}},
        {"status", {{"phase", "Pending"}}}};
    api_.add_pod(object);
    return object;
  }
  // Whether a pod of `gpus` whole GPUs passes filter on `node`.
  bool whole_gpus_fit(int gpus, const std::string& node) {
    const auto result = post(
        "filter",
        {{"Pod", pod("probe", {{"nvidia.com/gpu", std::to_string(gpus)}})}, {"NodeNames", {node}}});
    return result["NodeNames"] == nlohmann::json::array({node});
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
  // Prioritize's scores on nodes "lean" and "fat" for a CPU-light pod (one GPU, 4 cores) under
  // fgd-balanced, chosen by the pod's own annotation.
  std::map<std::string, int> light_pod_scores(const std::string& name) {
    nlohmann::json light = pod(name, {{"nvidia.com/gpu", "1"}}, "4");
    light["metadata"]["annotations"] = {{contract::kPolicyAnnotation, "fgd-balanced"}};
    std::map<std::string, int> by_node;
    for (const auto& entry : post("prioritize", {{"Pod", light}, {"NodeNames", {"lean", "fat"}}})) {
      by_node[entry["Host"].get<std::string>()] = entry["Score"].get<int>();
    }
    return by_node;
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
  ASSERT_TRUE(eventually([&] { return api_.lists.at("pods") >= 2; }));
  const int before = api_.lists.at("pods");
  api_.push("pods", {{"type", "ERROR"},
                     {"object",
                      {{"kind", "Status"},
                       {"status", "Failure"},
                       {"reason", "Expired"},
                       {"code", 410},
                       {"message", "too old resource version: 48220 (48990)"}}}});
  EXPECT_TRUE(eventually([&] { return api_.lists.at("pods") > before; }));
}

TEST_F(Extender, AnUnreadableWatchEventListsAgainRatherThanGuess) {
  // Listed once at start and once by the pods' watcher before it watches.
  ASSERT_TRUE(eventually([&] { return api_.lists.at("pods") >= 2; }));
  const int before = api_.lists.at("pods");
  api_.push("pods", {{"type", "MODIFIED"}, {"object", {{"metadata", 42}}}});
  EXPECT_TRUE(eventually([&] { return api_.lists.at("pods") > before; }));
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
      nlohmann::json::parse(
          calls[0].second)["metadata"]["annotations"][contract::kAssignmentAnnotation]
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

// The value of one series in Prometheus text, or -1 if it is not there.
double metric(const std::string& text, const std::string& series) {
  const std::string start = series + " ";
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    if (text.compare(at, start.size(), start) == 0)
      return std::stod(text.substr(at + start.size(), end - at - start.size()));
    at = end + 1;
  }
  return -1;
}

TEST_F(Extender, MetricsCountEachVerbTimeItAndShowBindFailuresAndTheStateSize) {
  auto scrape = [&] {
    const auto result = client_->Get("/metrics");
    EXPECT_TRUE(result);
    if (!result) return std::string();
    EXPECT_EQ(result->status, 200);
    return result->body;
  };
  auto series = [](const std::string& text, const std::string& name, const std::string& verb) {
    return metric(text, name + "{verb=\"" + verb + "\"}");
  };
  const std::string before = scrape();
  for (const char* verb : {"filter", "prioritize", "bind"})
    EXPECT_EQ(series(before, "tessera_extender_requests_total", verb), 0) << verb;
  const double nodes = metric(before, "tessera_extender_nodes");
  const double held = metric(before, "tessera_extender_pods_holding_gpus");
  EXPECT_GT(nodes, 0);
  EXPECT_GE(held, 0);

  post("filter", {{"Pod", pod("p4", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "20480"}})},
                  {"NodeNames", {"gpu-a"}}});
  post("prioritize", {{"Pod", pod("p5", {{"nvidia.com/gpu", "1"}})}, {"NodeNames", {"gpu-a"}}});
  post("filter", {{"Pod", "not a pod"}}, 400);
  post("filter", {{"Pod", pod("p6", {{"nvidia.com/gpu", "1"}})}, {"NodeNames", {"gpu-a"}}});
  EXPECT_EQ(bind("p4", "gpu-a")["Error"], "");
  EXPECT_EQ(bind("p5", "gpu-a")["Error"], "");
  EXPECT_NE(bind("p6", "gpu-a")["Error"], "");  // gpu-a is full

  const std::string after = scrape();
  EXPECT_EQ(series(after, "tessera_extender_requests_total", "filter"), 3);
  EXPECT_EQ(series(after, "tessera_extender_requests_total", "prioritize"), 1);
  EXPECT_EQ(series(after, "tessera_extender_requests_total", "bind"), 3);
  EXPECT_EQ(series(after, "tessera_extender_refused_requests_total", "filter"), 1);
  EXPECT_EQ(series(after, "tessera_extender_refused_requests_total", "bind"), 0);
  EXPECT_EQ(metric(after, "tessera_extender_bind_failures_total"), 1);
  EXPECT_EQ(metric(after, "tessera_extender_nodes"), nodes);
  EXPECT_EQ(metric(after, "tessera_extender_pods_holding_gpus"), held + 2);
  // Each verb's histogram: buckets that only grow, up to every request, and time spent.
  for (const std::string verb : {"filter", "prioritize", "bind"}) {
    const double count = series(after, "tessera_extender_request_duration_seconds_count", verb);
    EXPECT_EQ(count, series(after, "tessera_extender_requests_total", verb));
    const std::string bucket = "tessera_extender_request_duration_seconds_bucket{verb=\"" + verb;
    std::istringstream lines(after);
    std::vector<double> within;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(bucket + "\",le=", 0) == 0)
        within.push_back(std::stod(line.substr(line.rfind(' ') + 1)));
    }
    ASSERT_GE(within.size(), 2u) << after;
    EXPECT_TRUE(std::is_sorted(within.begin(), within.end())) << verb;
    EXPECT_EQ(within.back(), count) << "the +Inf bucket holds every " << verb;
    EXPECT_GT(series(after, "tessera_extender_request_duration_seconds_sum", verb), 0) << verb;
  }
}

// A node whose GPU 0 is cut into MIG devices (the node agent's mixed strategy) and GPU 1 whole.
nlohmann::json mig_node(const std::string& name, const std::string& cpu = "64") {
  const nlohmann::json gpus = {
      {"version", 2},
      {"gpus",
       {{{"index", 0},
         {"uuid", "GPU-mig"},
         {"model", "NVIDIA-A100-SXM4-80GB"},
         {"memory_mib", 81920},
         {"sharing", "mig"},
         {"slices", 1},
         {"healthy", true},
         {"mig_devices",
          {{{"uuid", "MIG-a"}, {"profile", "1g.10gb"}, {"memory_mib", 9728}},
           {{"uuid", "MIG-b"}, {"profile", "1g.10gb"}, {"memory_mib", 9728}},
           {{"uuid", "MIG-c"}, {"profile", "1g.10gb+me"}, {"memory_mib", 9728}}}}},
        {{"index", 1},
         {"uuid", "GPU-whole"},
         {"model", "NVIDIA-A100-SXM4-80GB"},
         {"memory_mib", 81920},
         {"sharing", "none"},
         {"slices", 1},
         {"healthy", true}}}}};
  return {
      {"metadata", {{"name", name}, {"annotations", {{contract::kGpusAnnotation, gpus.dump()}}}}},
      {"status", {{"allocatable", {{"cpu", cpu}, {"memory", "512Gi"}}}}}};
}

TEST_F(Extender, MigPodsGoWhereTheirProfileIsFreeAndHoldItOnceBound) {
  api_.push("nodes", {{"type", "ADDED"}, {"object", mig_node("mig-a")}});
  const auto filter = [&](const std::string& name, const nlohmann::json& limits) {
    return post("filter", {{"Pod", pod(name, limits)}, {"NodeNames", {"mig-a", "gpu-a"}}});
  };
  ASSERT_TRUE(eventually([&] {
    return filter("m0", {{"nvidia.com/mig-1g.10gb", "1"}})["NodeNames"] ==
           nlohmann::json::array({"mig-a"});
  }));
  EXPECT_EQ(filter("m0", {{"nvidia.com/mig-1g.10gb", "1"}})["FailedNodes"]["gpu-a"],
            "has 0 nvidia.com/mig-1g.10gb free; asks 1");
  EXPECT_EQ(filter("me", {{"nvidia.com/mig-1g.10gb.me", "1"}})["NodeNames"],
            nlohmann::json::array({"mig-a"}));
  EXPECT_EQ(filter("big", {{"nvidia.com/mig-3g.40gb", "1"}})["FailedNodes"]["mig-a"],
            "has 0 nvidia.com/mig-3g.40gb free; asks 1");
  // More profiles than a pod may ask for: refused with them named.
  nlohmann::json many;
  for (const char* profile : {"1g.10gb", "1g.10gb.me", "2g.20gb", "3g.40gb", "7g.80gb"})
    many[std::string("nvidia.com/mig-") + profile] = "1";
  const std::string crowded = filter("many", many)["FailedNodes"]["mig-a"];
  EXPECT_NE(crowded.find("asks for 5 MIG profiles (nvidia.com/mig-1g.10gb, "), std::string::npos)
      << crowded;
  EXPECT_NE(crowded.find("a pod may ask for at most 4"), std::string::npos) << crowded;
  // Two 1g pods bound: the third finds none free, and the whole GPU still takes a GPU pod.
  filter("m1", {{"nvidia.com/mig-1g.10gb", "1"}});
  filter("m2", {{"nvidia.com/mig-1g.10gb", "1"}});
  filter("m3", {{"nvidia.com/mig-1g.10gb", "1"}});
  EXPECT_EQ(bind("m1", "mig-a")["Error"], "");
  EXPECT_EQ(bind("m2", "mig-a")["Error"], "");
  EXPECT_NE(bind("m3", "mig-a")["Error"].get<std::string>().find(
                "has 0 nvidia.com/mig-1g.10gb free; asks 1"),
            std::string::npos);
  EXPECT_TRUE(whole_gpus_fit(1, "mig-a"));
  EXPECT_FALSE(whole_gpus_fit(2, "mig-a"));  // GPU 0 is MIG's
  // A bound MIG pod that ends gives its device back.
  nlohmann::json ended = pod("m1", {{"nvidia.com/mig-1g.10gb", "1"}});
  ended["spec"]["nodeName"] = "mig-a";
  ended["status"]["phase"] = "Succeeded";
  api_.push("pods", {{"type", "MODIFIED"}, {"object", ended}});
  EXPECT_TRUE(eventually([&] {
    return filter("m4", {{"nvidia.com/mig-1g.10gb", "1"}})["NodeNames"] ==
           nlohmann::json::array({"mig-a"});
  }));
  // A count that is not one is refused with the pod's name.
  const auto bad = post(
      "filter",
      {{"Pod", pod("m5", {{"nvidia.com/mig-1g.10gb", "lots"}})}, {"NodeNames", {"mig-a"}}}, 400);
  EXPECT_NE(bad.dump().find("is not a count of MIG devices"), std::string::npos) << bad.dump();
}

// A MIG GPU as a newer node agent lists it: its catalog model, and where each instance sits
// and whether a pod holds it (`placed`: false leaves both out, as an older agent did).
nlohmann::json recut_node(const std::string& name,
                          const std::vector<std::tuple<std::string, int, bool>>& instances,
                          bool placed = true) {
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& [profile, start, held] : instances) {
    nlohmann::json device{{"uuid", "MIG-" + name + "-" + std::to_string(start)},
                          {"profile", profile},
                          {"memory_mib", profile.rfind("3g", 0) == 0 ? 40192 : 9728}};
    if (placed) {
      device["start"] = start;
      device["held"] = held;
    }
    devices.push_back(device);
  }
  const nlohmann::json gpus = {{"version", 2},
                               {"gpus",
                                {{{"index", 0},
                                  {"uuid", "GPU-" + name},
                                  {"model", "NVIDIA-A100-SXM4-80GB"},
                                  {"mig_model", "A100-80GB"},
                                  {"memory_mib", 81920},
                                  {"sharing", "mig"},
                                  {"slices", 1},
                                  {"healthy", true},
                                  {"mig_devices", devices}}}}};
  return {
      {"metadata", {{"name", name}, {"annotations", {{contract::kGpusAnnotation, gpus.dump()}}}}},
      {"status", {{"allocatable", {{"cpu", "64"}, {"memory", "512Gi"}}}}}};
}

TEST_F(Extender, AMigPodThatFitsNowhereHasAGpuCutAgainAroundTheHeldInstances) {
  // Seven 1g instances; a pod holds the one at slice 0.
  std::vector<std::tuple<std::string, int, bool>> sevens;
  for (int start = 0; start < 7; ++start) sevens.emplace_back("1g.10gb", start, start == 0);
  api_.push("nodes", {{"type", "ADDED"}, {"object", recut_node("cut", sevens)}});
  api_.push("nodes", {{"type", "ADDED"}, {"object", recut_node("old", sevens, false)}});
  const auto filter = [&](const std::string& name, const std::string& profile,
                          const std::vector<std::string>& nodes) {
    return post("filter",
                {{"Pod", pod(name, {{"nvidia.com/mig-" + profile, "1"}})}, {"NodeNames", nodes}});
  };
  ASSERT_TRUE(eventually([&] {
    return filter("probe", "1g.10gb", {"cut", "old"})["NodeNames"].size() == 2;
  }));
  const auto node_patches = [&] {
    std::vector<std::string> bodies;
    for (const auto& [what, body] : api_.calls()) {
      if (what.rfind("PATCH /api/v1/nodes/", 0) == 0) bodies.push_back(what + " " + body);
    }
    return bodies;
  };
  // A whole-GPU 7g would take the held instance: no cut is asked for.
  EXPECT_EQ(filter("whole", "7g.80gb", {"cut"})["FailedNodes"]["cut"],
            "has 0 nvidia.com/mig-7g.80gb free; asks 1");
  // Nor on a node whose agent does not say which instances are held.
  EXPECT_EQ(filter("big-old", "3g.40gb", {"old"})["FailedNodes"]["old"],
            "has 0 nvidia.com/mig-3g.40gb free; asks 1");
  EXPECT_TRUE(node_patches().empty());
  // A 3g fits beside the held 1g at slices 4-7: three free 1g go, the rest stay.
  const nlohmann::json answer = filter("big", "3g.40gb", {"cut", "old"});
  EXPECT_EQ(answer["FailedNodes"]["cut"],
            "has 0 nvidia.com/mig-3g.40gb free; asks 1; GPU 0 is being cut again for it "
            "(tessera.io/mig-layout)");
  const std::vector<std::string> patches = node_patches();
  ASSERT_EQ(patches.size(), 1u);
  const auto body = nlohmann::json::parse(patches[0].substr(patches[0].find(' ', 6) + 1));
  EXPECT_EQ(patches[0].rfind("PATCH /api/v1/nodes/cut ", 0), 0u) << patches[0];
  EXPECT_EQ(nlohmann::json::parse(
                body["metadata"]["annotations"][contract::kMigLayoutAnnotation].get<std::string>()),
            (nlohmann::json{{"0", {{"1g.10gb", 4}, {"3g.40gb", 1}}}}));
  // Asked again while the node applies it: the same answer, no second write.
  EXPECT_EQ(filter("big", "3g.40gb", {"cut"})["FailedNodes"]["cut"], answer["FailedNodes"]["cut"]);
  EXPECT_EQ(node_patches().size(), 1u);
}

// A node whose GPUs are all time-sliced: its replicas are the kubelet's to count. A pod asking
// for whole GPUs alone passes, holding only its CPU and memory; one asking for part of a GPU
// does not (no GPU there is cut into slices).
TEST_F(Extender, WholeGpuPodsGoToTimeSlicedNodesWhereTheKubeletCountsTheReplicas) {
  const nlohmann::json gpus{{"version", 2},
                            {"gpus",
                             {{{"index", 0},
                               {"uuid", "GPU-ts0"},
                               {"model", "Tesla-T4"},
                               {"memory_mib", 15360},
                               {"sharing", "timeslice"},
                               {"slices", 4},
                               {"healthy", true}}}}};
  nlohmann::json node;
  node["metadata"] = {{"name", "ts"}, {"annotations", {{contract::kGpusAnnotation, gpus.dump()}}}};
  node["status"]["allocatable"] = {{"cpu", "8"}, {"memory", "32Gi"}};
  api_.push("nodes", {{"type", "ADDED"}, {"object", node}});
  ASSERT_TRUE(eventually([&] { return whole_gpus_fit(1, "ts"); }));
  const nlohmann::json part = post(
      "filter", {{"Pod", pod("part", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "1024"}})},
                 {"NodeNames", {"ts"}}});
  EXPECT_EQ(part["NodeNames"], nlohmann::json::array()) << part.dump();
  // Bound, it holds its CPU: 3 more such pods of 2 cores fit the node's 8, a fifth does not.
  pod("w0", {{"nvidia.com/gpu", "1"}});
  ASSERT_EQ(bind("w0", "ts")["Error"], "");
  const nlohmann::json record = nlohmann::json::parse(
      api_.calls()[0].second)["metadata"]["annotations"][contract::kAssignmentAnnotation];
  EXPECT_EQ(kube::assignment_from_annotation(record).gpus, std::vector<int>{})
      << "no GPU of its own: the kubelet gives it a replica";
  for (const char* name : {"w1", "w2", "w3"}) {
    pod(name, {{"nvidia.com/gpu", "1"}});
    ASSERT_EQ(bind(name, "ts")["Error"], "") << name;
  }
  const nlohmann::json full =
      post("filter", {{"Pod", pod("w4", {{"nvidia.com/gpu", "1"}})}, {"NodeNames", {"ts"}}});
  EXPECT_EQ(full["FailedNodes"]["ts"], "not enough CPU or memory") << full.dump();
}

TEST_F(Extender, MigPodsArePackedWhereTheirProfileIsInUseAlready) {
  // mig-a has less CPU: by CPU and memory alone (best-fit) it is the tighter node.
  api_.push("nodes", {{"type", "ADDED"}, {"object", mig_node("mig-a", "16")}});
  api_.push("nodes", {{"type", "ADDED"}, {"object", mig_node("mig-b")}});
  const nlohmann::json one_g = {{"nvidia.com/mig-1g.10gb", "1"}};
  const auto scores = [&](const std::string& name, const std::string& policy) {
    nlohmann::json asking = pod(name, one_g);
    asking["metadata"]["annotations"] = {{contract::kPolicyAnnotation, policy}};
    std::map<std::string, int> by_node;
    for (const auto& entry :
         post("prioritize", {{"Pod", asking}, {"NodeNames", {"mig-a", "mig-b", "gpu-a"}}})) {
      by_node[entry["Host"].get<std::string>()] = entry["Score"].get<int>();
    }
    return by_node;
  };
  ASSERT_TRUE(eventually([&] {
    return post("filter",
                {{"Pod", pod("m0", one_g)}, {"NodeNames", {"mig-a", "mig-b"}}})["NodeNames"]
               .size() == 2;
  }));
  // Their devices alike and free: FGD rates them equal; a node without the profile gets none.
  std::map<std::string, int> before = scores("m0", "fgd-balanced");
  EXPECT_EQ(before["mig-a"], before["mig-b"]);
  EXPECT_EQ(before["gpu-a"], 0);
  // Best-fit weighs a MIG device as the share of a GPU it is, beside the CPU left.
  std::map<std::string, int> tight = scores("m0", "best-fit");
  EXPECT_GT(tight["mig-a"], tight["mig-b"]);
  // One of mig-b's two 1g devices in use: the next 1g pod is packed beside it.
  post("filter", {{"Pod", pod("m1", one_g)}, {"NodeNames", {"mig-b"}}});
  ASSERT_EQ(bind("m1", "mig-b")["Error"], "");
  for (const std::string policy : {"fgd-balanced", "fgd-packed", "gpu-packing"}) {
    std::map<std::string, int> after = scores("m2", policy);
    EXPECT_EQ(after["mig-b"], 10) << policy;
    EXPECT_LT(after["mig-a"], after["mig-b"]) << policy;
  }
}

// A node of `gpus` whole A100s and `cpu` cores.
nlohmann::json gpu_node(const std::string& name, const std::string& cpu, int gpus) {
  nlohmann::json list = nlohmann::json::array();
  for (int index = 0; index < gpus; ++index) {
    list.push_back({{"index", index},
                    {"uuid", "GPU-" + name + "-" + std::to_string(index)},
                    {"model", "NVIDIA-A100-SXM4-80GB"},
                    {"memory_mib", 81920},
                    {"sharing", "none"},
                    {"slices", 1},
                    {"healthy", true}});
  }
  const nlohmann::json gpus_annotation = {{"version", 2}, {"gpus", list}};
  return {
      {"metadata",
       {{"name", name}, {"annotations", {{contract::kGpusAnnotation, gpus_annotation.dump()}}}}},
      {"status", {{"allocatable", {{"cpu", cpu}, {"memory", "512Gi"}}}}}};
}

TEST_F(Extender, FgdMeasuresAgainstThePodsItHoldsAndBalancedPlacementKeepsCpuForGpus) {
  // lean: 2 GPUs and 16 cores; fat: 2 GPUs and 100 cores; big takes the workload's pods.
  api_.push("nodes", {{"type", "ADDED"}, {"object", gpu_node("lean", "16", 2)}});
  api_.push("nodes", {{"type", "ADDED"}, {"object", gpu_node("fat", "100", 2)}});
  api_.push("nodes", {{"type", "ADDED"}, {"object", gpu_node("big", "96", 8)}});
  ASSERT_TRUE(eventually([&] { return whole_gpus_fit(8, "big") && whole_gpus_fit(2, "lean"); }));
  // Nothing held yet: no workload to measure against, and the nodes score alike.
  std::map<std::string, int> before = light_pod_scores("light-0");
  EXPECT_EQ(before["lean"], before["fat"]);
  // Eight pods of 10 cores per GPU bound: lean's 16 cores cannot feed both of its GPUs at that
  // ratio, so the CPU-light pod goes there and fat keeps its CPU for CPU-heavy pods.
  for (int i = 0; i < 8; ++i) {
    const std::string name = "w" + std::to_string(i);
    post("filter", {{"Pod", pod(name, {{"nvidia.com/gpu", "1"}}, "10")}, {"NodeNames", {"big"}}});
    ASSERT_EQ(bind(name, "big")["Error"], "") << name;
  }
  std::map<std::string, int> after = light_pod_scores("light-1");
  EXPECT_EQ(after["lean"], 10);
  EXPECT_EQ(after["fat"], 0);
}

TEST_F(Extender, FgdAlsoMeasuresAgainstThePodsWaitingForANode) {
  api_.push("nodes", {{"type", "ADDED"}, {"object", gpu_node("lean", "16", 2)}});
  api_.push("nodes", {{"type", "ADDED"}, {"object", gpu_node("fat", "100", 2)}});
  ASSERT_TRUE(eventually([&] { return whole_gpus_fit(2, "lean") && whole_gpus_fit(2, "fat"); }));
  std::map<std::string, int> before = light_pod_scores("light-0");
  EXPECT_EQ(before["lean"], before["fat"]);
  const auto waiting_now = [&] {
    return metric(client_->Get("/metrics")->body, "tessera_extender_pods_waiting");
  };
  const double waited = waiting_now();
  // Eight pods of 10 cores per GPU wait for a node (none bound): they are the workload too.
  std::vector<nlohmann::json> waiting;
  for (int i = 0; i < 8; ++i) {
    waiting.push_back(pod("w" + std::to_string(i), {{"nvidia.com/gpu", "1"}}, "10"));
    api_.push("pods", {{"type", "ADDED"}, {"object", waiting.back()}});
  }
  EXPECT_TRUE(eventually([&] {
    std::map<std::string, int> now = light_pod_scores("light-1");
    return now["lean"] == 10 && now["fat"] == 0;
  }));
  EXPECT_EQ(waiting_now(), waited + 8);
  // Deleted while waiting, they no longer count.
  for (const nlohmann::json& gone : waiting)
    api_.push("pods", {{"type", "DELETED"}, {"object", gone}});
  EXPECT_TRUE(eventually([&] {
    std::map<std::string, int> now = light_pod_scores("light-2");
    return now["lean"] == now["fat"];
  }));
  EXPECT_EQ(waiting_now(), waited);
}

TEST_F(Extender, PodsWithoutGpusTakeTheirCpuFromWhatGpuPodsFind) {
  api_.push("nodes", {{"type", "ADDED"}, {"object", gpu_node("lean", "16", 2)}});
  ASSERT_TRUE(eventually([&] { return whole_gpus_fit(2, "lean"); }));
  const auto fits = [&](const std::string& name, const std::string& cpu) {
    return post("filter", {{"Pod", pod(name, {{"nvidia.com/gpu", "1"}}, cpu)},
                           {"NodeNames", {"lean"}}})["NodeNames"] ==
           nlohmann::json::array({"lean"});
  };
  const double held = metric(client_->Get("/metrics")->body, "tessera_extender_pods_holding_gpus");
  // A batch job of 12 cores and no GPU starts on lean: 4 cores are left for GPU pods.
  nlohmann::json batch = pod("batch", nlohmann::json::object(), "12");
  batch["spec"]["nodeName"] = "lean";
  batch["status"]["phase"] = "Running";
  api_.push("pods", {{"type", "ADDED"}, {"object", batch}});
  ASSERT_TRUE(eventually([&] { return !fits("g0", "8"); }));
  EXPECT_TRUE(fits("g1", "4"));
  EXPECT_EQ(metric(client_->Get("/metrics")->body, "tessera_extender_pods_holding_gpus"), held);
  // It ends: its CPU is free again.
  batch["status"]["phase"] = "Succeeded";
  api_.push("pods", {{"type", "MODIFIED"}, {"object", batch}});
  EXPECT_TRUE(eventually([&] { return fits("g2", "8"); }));
}

// A node of `gpus` A100-80GB cut into slices (fractional pods welcome), 64 cores.
nlohmann::json sliced_node(const std::string& name, int gpus) {
  nlohmann::json node = gpu_node(name, "64", gpus);
  nlohmann::json annotation = nlohmann::json::parse(
      node["metadata"]["annotations"][contract::kGpusAnnotation].get<std::string>());
  for (auto& gpu : annotation["gpus"]) {
    gpu["sharing"] = "slices";
    gpu["slices"] = 10;
  }
  node["metadata"]["annotations"][contract::kGpusAnnotation] = annotation.dump();
  return node;
}

class Preemption : public Extender {
 protected:
  // A pod running on `node`, holding `gpumem_mib` of GPU `gpu` (80 GB: 8192 MiB is 100
  // milli-GPU), of `priority`.
  nlohmann::json running(const std::string& name, const std::string& node, int gpu, int gpumem_mib,
                         int priority) {
    nlohmann::json object =
        pod(name, {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", std::to_string(gpumem_mib)}});
    object["spec"]["nodeName"] = node;
    object["spec"]["priority"] = priority;
    object["status"]["phase"] = "Running";
    const nlohmann::json record{
        {"node", node}, {"gpus", {gpu}}, {"milli", gpumem_mib * 1000 / 81920}};
    object["metadata"]["annotations"] = {{contract::kAssignmentAnnotation, record.dump()}};
    api_.push("pods", {{"type", "ADDED"}, {"object", object}});
    return object;
  }
  nlohmann::json asking(const std::string& name, int gpumem_mib, int priority) {
    nlohmann::json object =
        pod(name, {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", std::to_string(gpumem_mib)}});
    object["spec"]["priority"] = priority;
    return object;
  }
  bool fits(const nlohmann::json& object, const std::string& node) {
    return post("filter", {{"Pod", object}, {"NodeNames", {node}}})["NodeNames"] ==
           nlohmann::json::array({node});
  }
  // The victims' UIDs per node in a preempt answer.
  static std::map<std::string, std::set<std::string>> victims(const nlohmann::json& answer) {
    std::map<std::string, std::set<std::string>> by_node;
    for (const auto& [node, chosen] : answer["NodeNameToMetaVictims"].items()) {
      auto& uids = by_node[node];
      for (const auto& victim : chosen["Pods"]) uids.insert(victim["UID"].get<std::string>());
    }
    return by_node;
  }
};

TEST_F(Preemption, VictimsFreeOneGpuWhereTheNodeLevelViewPicksWrong) {
  api_.push("nodes", {{"type", "ADDED"}, {"object", sliced_node("shared", 2)}});
  api_.push("nodes", {{"type", "ADDED"}, {"object", sliced_node("other", 1)}});
  // shared: GPU 0 runs a (40 GiB, priority 100), GPU 1 runs b and c (24 GiB each, priority 0).
  const nlohmann::json a = running("a", "shared", 0, 40960, 100);
  const nlohmann::json b = running("b", "shared", 1, 24576, 0);
  running("c", "shared", 1, 24576, 0);
  // other: its one GPU runs d, of priority 5000.
  running("d", "other", 0, 40960, 5000);
  const nlohmann::json big = asking("big", 65536, 1000);  // 64 GiB: 800 milli-GPU
  ASSERT_TRUE(eventually([&] {
    return !fits(big, "shared") && !fits(big, "other") && fits(asking("small", 8192, 0), "other");
  }));
  // kube-scheduler's node-level view (a GPU count) offers b alone, the lowest priority: with b
  // gone, c still leaves no GPU 64 GiB. Tessera answers with a, which frees GPU 0 alone.
  const nlohmann::json answer = post(
      "preempt", {{"Pod", big},
                  {"NodeNameToVictims",
                   {{"shared", {{"Pods", {b}}, {"NumPDBViolations", 1}}},
                    {"other", {{"Pods", nlohmann::json::array()}, {"NumPDBViolations", 0}}}}}});
  EXPECT_EQ(victims(answer), (std::map<std::string, std::set<std::string>>{{"shared", {"uid-a"}}}))
      << answer.dump();
  EXPECT_EQ(answer["NodeNameToMetaVictims"]["shared"]["NumPDBViolations"], 1);  // kept as sent
  // At priority 100, a is an equal: b and c go, freeing GPU 1. The same by UIDs
  // (nodeCacheCapable).
  const nlohmann::json equal = asking("equal", 65536, 100);
  EXPECT_EQ(
      victims(post("preempt",
                   {{"Pod", equal},
                    {"NodeNameToMetaVictims",
                     {{"shared", {{"Pods", {{{"UID", "uid-b"}}}}, {"NumPDBViolations", 0}}}}}})),
      (std::map<std::string, std::set<std::string>>{{"shared", {"uid-b", "uid-c"}}}));
  // At priority 0 nobody may go: no node is answered.
  EXPECT_EQ(
      victims(post("preempt",
                   {{"Pod", asking("low", 65536, 0)},
                    {"NodeNameToMetaVictims",
                     {{"shared", {{"Pods", nlohmann::json::array()}}}, {"other", nullptr}}}})),
      (std::map<std::string, std::set<std::string>>{}));
  // A pod that fits already needs no victims; a node Tessera does not know is left out.
  EXPECT_EQ(victims(post("preempt", {{"Pod", asking("tiny", 8192, 1000)},
                                     {"NodeNameToMetaVictims",
                                      {{"other", {{"Pods", nlohmann::json::array()}}},
                                       {"nowhere", {{"Pods", nlohmann::json::array()}}}}}})),
            (std::map<std::string, std::set<std::string>>{{"other", {}}}));
  // The victims gone, the pod fits where Tessera said.
  api_.push("pods", {{"type", "DELETED"}, {"object", a}});
  EXPECT_TRUE(eventually([&] { return fits(big, "shared"); }));
  EXPECT_GE(
      metric(client_->Get("/metrics")->body, "tessera_extender_requests_total{verb=\"preempt\"}"),
      4);
}

TEST_F(Preemption, MalformedPreemptionArgsAreRefusedWithAReason) {
  const nlohmann::json object = asking("p", 8192, 10);
  const auto reason = [&](const nlohmann::json& body) {
    return post("preempt", body, 400)["Error"].get<std::string>();
  };
  EXPECT_NE(reason({{"Pod", object}}).find("neither NodeNameToVictims nor NodeNameToMetaVictims"),
            std::string::npos);
  EXPECT_NE(reason({{"NodeNameToMetaVictims", nlohmann::json::object()}}).find("no Pod"),
            std::string::npos);
  EXPECT_NE(reason({{"Pod", object}, {"NodeNameToVictims", {1, 2}}}).find("not an object"),
            std::string::npos);
  EXPECT_NE(reason({{"Pod", object}, {"NodeNameToMetaVictims", {{"Bad_Node!", nullptr}}}})
                .find("not a node name"),
            std::string::npos);
  EXPECT_NE(reason({{"Pod", object},
                    {"NodeNameToMetaVictims", {{"shared", {{"NumPDBViolations", "1"}}}}}})
                .find("NumPDBViolations"),
            std::string::npos);
  for (const nlohmann::json& priority :
       {nlohmann::json("high"), nlohmann::json(1.5), nlohmann::json(4294967296LL)}) {
    nlohmann::json odd = object;
    odd["spec"]["priority"] = priority;
    EXPECT_NE(reason({{"Pod", odd}, {"NodeNameToMetaVictims", nlohmann::json::object()}})
                  .find("spec.priority"),
              std::string::npos)
        << priority;
  }
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

// --- hostile and broken input -----------------------------------------------------------------

// Found by fuzz_kube_objects: fields of the wrong JSON type reached nlohmann's typed getters.
TEST_F(Extender, FieldsOfTheWrongTypeAreRefusedByName) {
  struct Case {
    std::string body, expected;
  } cases[] = {
      {R"({"Pod": {"metadata": {"name": "x", "namespace": 7}}, "NodeNames": ["gpu-a"]})",
       "pod x: metadata.namespace is not a string"},
      {R"({"Pod": {"metadata": {"name": "x", "uid": ["u"]}}, "NodeNames": ["gpu-a"]})",
       "pod x: metadata.uid is not a string"},
      {R"({"Pod": {"metadata": {"name": "x"}, "spec": {"containers": {"c": 1}}}, "NodeNames": []})",
       "pod default/x: spec.containers is not a list"},
      {R"({"Pod": {"metadata": {"name": "x"}, "spec": {"containers": [{"resources": "all"}]}}, "NodeNames": []})",
       "pod default/x: a container's resources is not an object"},
      {R"({"Pod": {"metadata": {"name": "x", "annotations": [1]}}, "NodeNames": []})",
       "pod default/x: metadata.annotations is not an object"},
      {R"({"Pod": {"metadata": {"name": "x"}}, "Nodes": {"items": [{"metadata": {"name": "n"}, "status": {"allocatable": 5}}]}})",
       "node n: status.allocatable is not an object"},
  };
  for (const Case& c : cases) {
    auto result = client_->Post("/filter", c.body, "application/json");
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 400) << c.body;
    EXPECT_NE(result->body.find(c.expected), std::string::npos) << c.body << " -> " << result->body;
  }
  EXPECT_TRUE(whole_gpus_fit(1, "gpu-a"));  // and it carries on
}

// A pod bound to `node` whose assignment annotation is `record` (any JSON value, written as
// the annotation's text if it is a string, or as is otherwise).
nlohmann::json bound_pod(const std::string& name, const std::string& node, int gpus,
                         const nlohmann::json& record) {
  nlohmann::json object{
      {"metadata",
       {{"name", name},
        {"namespace", "ml"},
        {"uid", "uid-" + name},
        {"resourceVersion", "9"},
        {"annotations", {{contract::kAssignmentAnnotation, record}}}}},
      {"spec",
       {{"nodeName", node},
        {"containers",
         {{{"name", "c"},
           {"resources", {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}}}}}}}}}},
      {"status", {{"phase", "Running"}}}};
  return object;
}

TEST_F(Extender, AnAssignmentNamingMoreGpusThanANodeHoldsIsReportedAndTheGpusStillHeld) {
  nlohmann::json many = nlohmann::json::array();
  for (int i = 0; i < 40; ++i) many.push_back(i % 2);
  const nlohmann::json record{{"node", "gpu-c"}, {"gpus", many}, {"milli", 1000}};
  const nlohmann::json greedy = bound_pod("greedy", "gpu-c", 2, record.dump());
  // Watched, then listed again after a restart: neither may crash it, and the pod's two GPUs
  // stay held (the record is unusable, so the engine picks two for it).
  ASSERT_TRUE(whole_gpus_fit(2, "gpu-c"));
  api_.push("pods", {{"type", "ADDED"}, {"object", greedy}});
  EXPECT_TRUE(eventually([&] { return !whole_gpus_fit(1, "gpu-c"); }));
  api_.add_listed("pods", greedy);
  restart();
  EXPECT_FALSE(whole_gpus_fit(1, "gpu-c"));
  EXPECT_TRUE(whole_gpus_fit(2, "gpu-b"));  // and the rest of the state is intact
}

TEST_F(Extender, OneUnreadablePodInAListDoesNotHideTheOthers) {
  // serve-0 (the fixture) holds half of gpu-a's GPU 0. Next to it in the list: pods whose
  // records cannot be read, and a pod that is not a pod.
  api_.add_listed("pods", bound_pod("garbled", "gpu-c", 1, "{not json"));
  api_.add_listed("pods", bound_pod("typed", "gpu-c", 1, 42));
  api_.add_listed("pods", nlohmann::json::array({1, 2, 3}));
  restart();
  EXPECT_FALSE(whole_gpus_fit(2, "gpu-a")) << "serve-0's GPU looks free: the list was lost";
  EXPECT_TRUE(whole_gpus_fit(1, "gpu-a"));
  // Both garbled pods run on gpu-c: each still holds a GPU there.
  EXPECT_FALSE(whole_gpus_fit(1, "gpu-c"));
}

TEST_F(Extender, DeeplyNestedJsonIsRefusedAndTheSchedulerCarriesOn) {
  for (const char* verb : {"filter", "prioritize", "bind"}) {
    const std::string body = std::string(200000, '[') + std::string(200000, ']');
    auto result = client_->Post(std::string("/") + verb, body, "application/json");
    ASSERT_TRUE(result) << verb << ": no answer (crashed?)";
    EXPECT_EQ(result->status, 400);
    EXPECT_NE(result->body.find("nested deeper"), std::string::npos) << result->body;
  }
  api_.push_raw("pods", std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_TRUE(whole_gpus_fit(2, "gpu-c"));
}

TEST_F(Extender, WatchEventsOfTheWrongShapeAreReportedAndTheWatchGoesOn) {
  ASSERT_TRUE(eventually([&] { return api_.lists.at("pods") >= 2; }));
  for (const nlohmann::json& event :
       {nlohmann::json{{"type", 5}}, nlohmann::json::array({1, 2}), nlohmann::json("text"),
        nlohmann::json{{"type", "ERROR"}, {"object", {{"code", "410"}}}},
        nlohmann::json{{"type", "ADDED"}, {"object", {{"metadata", {{"uid", 7}}}}}},
        nlohmann::json{{"type", "ADDED"}, {"object", 3}},
        nlohmann::json{{"type", "MODIFIED"},
                       {"object", {{"metadata", {{"uid", "u"}, {"resourceVersion", 12}}}}}}}) {
    api_.push("pods", event);
  }
  nlohmann::json trainer =
      bound_pod("trainer", "gpu-c", 2, R"({"node": "gpu-c", "gpus": [0, 1], "milli": 1000})");
  api_.add_listed("pods", trainer);  // where a relist finds it
  api_.push("pods", {{"type", "ADDED"}, {"object", trainer}});
  EXPECT_TRUE(eventually([&] { return !whole_gpus_fit(1, "gpu-c"); }));
}

TEST_F(Extender, AnAssignmentOnAPodNotBoundHoldsNothing) {
  // A record left by a bind that failed half-way: the pod waits, unbound, for another try.
  nlohmann::json stranded =
      bound_pod("stranded", "", 2, R"({"node": "gpu-c", "gpus": [0, 1], "milli": 1000})");
  stranded["spec"].erase("nodeName");
  stranded["status"]["phase"] = "Pending";
  api_.add_listed("pods", stranded);
  restart();
  EXPECT_TRUE(whole_gpus_fit(2, "gpu-c"));
}

TEST_F(Extender, AFailedBindingTakesItsAssignmentBackAndGivesTheGpusBack) {
  post("filter", {{"Pod", pod("doomed", {{"nvidia.com/gpu", "2"}})}, {"NodeNames", {"gpu-c"}}});
  api_.failures = 3;  // every attempt at the binding fails
  const std::string error = bind("doomed", "gpu-c")["Error"];
  EXPECT_NE(error.find("binding ml/doomed to gpu-c failed: HTTP 503"), std::string::npos) << error;
  const auto calls = api_.calls();
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back().first, "PATCH /api/v1/namespaces/ml/pods/doomed");
  EXPECT_TRUE(nlohmann::json::parse(
                  calls.back().second)["metadata"]["annotations"][contract::kAssignmentAnnotation]
                  .is_null())
      << calls.back().second;
  EXPECT_TRUE(whole_gpus_fit(2, "gpu-c"));
}

TEST_F(Extender, ABindForAPodBoundAlreadyLeavesItsAssignmentAlone) {
  nlohmann::json running = pod("running", {{"nvidia.com/gpu", "1"}});
  running["spec"]["nodeName"] = "gpu-a";
  api_.add_pod(running);
  const std::string error = bind("running", "gpu-c")["Error"];
  EXPECT_NE(error.find("bound to gpu-a already"), std::string::npos) << error;
  for (const auto& call : api_.calls()) EXPECT_EQ(call.first.find("PATCH"), std::string::npos);

  // Bound by someone else between the read and the binding: 409, and the record is taken back.
  pod("raced", {{"nvidia.com/gpu", "1"}});
  api_.binding_conflict = true;
  const std::string raced = bind("raced", "gpu-c")["Error"];
  EXPECT_NE(raced.find("HTTP 409"), std::string::npos) << raced;
  const auto calls = api_.calls();
  ASSERT_FALSE(calls.empty());
  EXPECT_TRUE(nlohmann::json::parse(
                  calls.back().second)["metadata"]["annotations"][contract::kAssignmentAnnotation]
                  .is_null());
  api_.binding_conflict = false;
  EXPECT_TRUE(whole_gpus_fit(2, "gpu-c"));
}

TEST_F(Extender, APodChangedSinceItWasReadIsNotRecorded) {
  // The API server refuses a patch naming a version the pod no longer has.
  nlohmann::json changing = pod("changing", {{"nvidia.com/gpu", "1"}});
  api_.add_pod(changing);
  std::thread change([&] {
    changing["metadata"]["resourceVersion"] = "8";
    api_.add_pod(changing);
  });
  change.join();
  const auto calls_before = api_.calls().size();
  // Read at version 8 now: the patch carries 8, which matches.
  EXPECT_EQ(bind("changing", "gpu-c")["Error"], "");
  const auto calls = api_.calls();
  ASSERT_GT(calls.size(), calls_before);
  EXPECT_EQ(nlohmann::json::parse(calls[calls_before].second)["metadata"]["resourceVersion"], "8");
}

TEST_F(Extender, IdleClientsAndBindsStuckOnTheApiServerDoNotHoldUpFilter) {
  stop();
  start({}, 60000);  // binds wait on the API server for as long as it holds them
  // Twenty binds wait on an API server that does not answer their first call (reading the
  // pod) until filter has been answered; the scheduler's API timeout is longer than this test.
  for (int i = 0; i < 20; ++i) pod("stuck" + std::to_string(i), {{"nvidia.com/gpu", "1"}});
  api_.hold_pod_reads();
  std::mutex mutex;
  std::vector<std::chrono::steady_clock::time_point> bind_ends;
  std::vector<std::thread> binds;
  for (int i = 0; i < 20; ++i) {
    binds.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", port_);
      client.set_read_timeout(30, 0);
      const nlohmann::json body{{"PodName", "stuck" + std::to_string(i)},
                                {"PodNamespace", "ml"},
                                {"PodUID", "uid-stuck" + std::to_string(i)},
                                {"Node", "gpu-b"}};
      client.Post("/bind", body.dump(), "application/json");
      std::lock_guard<std::mutex> locked(mutex);
      bind_ends.push_back(std::chrono::steady_clock::now());
    });
  }
  // The scheduler refuses binds over its limit at once, and only while the limit's worth wait:
  // four refusals mean sixteen binds are stuck.
  const bool sixteen_stuck = eventually([&] {
    std::lock_guard<std::mutex> locked(mutex);
    return bind_ends.size() >= 4;
  });
  // Twenty clients connect and send half a request; each holds a server thread until its
  // read times out and the server closes it.
  std::vector<int> idle;
  for (int i = 0; sixteen_stuck && i < 20; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(port_));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    const std::string half = "POST /filter HTTP/1.1\r\nHost: x\r\n";
    EXPECT_EQ(send(fd, half.data(), half.size(), 0), static_cast<ssize_t>(half.size()));
    idle.push_back(fd);
  }
  // Filter is answered while all of that waits: before any stuck bind ends, and before the
  // server has let go of any idle client.
  const auto result =
      post("filter", {{"Pod", pod("quick", {{"nvidia.com/gpu", "1"}})}, {"NodeNames", {"gpu-c"}}});
  const auto answered = std::chrono::steady_clock::now();
  EXPECT_EQ(result["NodeNames"], nlohmann::json::array({"gpu-c"}));
  int closed_by_server = 0;
  for (int fd : idle) {
    char byte;
    closed_by_server += recv(fd, &byte, 1, MSG_DONTWAIT) == 0;
  }
  EXPECT_EQ(closed_by_server, 0) << "filter waited until idle clients timed out";
  api_.release_pod_reads();
  for (auto& thread : binds) thread.join();
  for (int fd : idle) close(fd);
  EXPECT_TRUE(sixteen_stuck) << "binds over the limit were not refused at once";
  std::lock_guard<std::mutex> locked(mutex);
  int ended_before = 0;
  for (const auto& end : bind_ends) ended_before += end < answered;
  // Only the four refused binds may have ended before filter was answered.
  EXPECT_EQ(ended_before, 20 - 16) << "filter waited for binds stuck on the API server";
}

TEST_F(Extender, BodiesThatAreNotUtf8OrTooLargeGetAReason) {
  auto bad_utf8 = client_->Post(
      "/filter", "{\"Pod\": {\"metadata\": {\"name\": \"\xff\xfe\"}}, \"NodeNames\": []}",
      "application/json");
  ASSERT_TRUE(bad_utf8);
  EXPECT_EQ(bad_utf8->status, 400);
  EXPECT_TRUE(nlohmann::json::accept(bad_utf8->body)) << bad_utf8->body;
  auto huge =
      client_->Post("/filter", std::string((std::size_t{65} << 20), ' '), "application/json");
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->status, 413);
}

TEST_F(Extender, QuantitiesOutOfRangeAreRefusedNotWrapped) {
  struct Case {
    nlohmann::json limits, requests;
    const char* expected;
  } cases[] = {
      {{{"nvidia.com/gpu", "4294967296"}}, {}, "limits.nvidia.com/gpu=\"4294967296\" is not a"},
      {{{"nvidia.com/gpu", "1.5"}}, {}, "limits.nvidia.com/gpu=\"1.5\" is not a"},
      {{{"nvidia.com/gpu", "-1"}}, {}, "limits.nvidia.com/gpu=\"-1\" is not a"},
      {{{"nvidia.com/gpu", 1e300}}, {}, "limits.nvidia.com/gpu=1e+300 is not a"},
      {{}, {{"cpu", "1e300"}}, "requests.cpu=\"1e300\" is not a"},
      {{}, {{"memory", "99999999999999999999Ei"}}, "requests.memory="},
  };
  for (const Case& c : cases) {
    nlohmann::json object = pod("big", c.limits);
    auto& resources = object["spec"]["containers"][0]["resources"];
    resources["limits"] = c.limits.is_null() ? nlohmann::json::object() : c.limits;
    resources["requests"] = c.requests.is_null() ? nlohmann::json::object() : c.requests;
    auto result =
        client_->Post("/filter", nlohmann::json{{"Pod", object}, {"NodeNames", {"gpu-a"}}}.dump(),
                      "application/json");
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 400) << object.dump();
    const std::string error = nlohmann::json::parse(result->body).value("Error", "");
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
}

TEST_F(Extender, AWatchThatExpiresEveryTimeIsRetriedEverMoreSlowly) {
  api_.expire_every_watch = true;
  restart();
  const int before = api_.lists.at("pods");
  const auto from = std::chrono::steady_clock::now();
  // Three seconds of 410s: the backoff (100 ms doubling) allows about five relists, where an
  // unthrottled watcher makes hundreds.
  while (std::chrono::steady_clock::now() - from < std::chrono::seconds(3)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const int relists = api_.lists.at("pods") - before;
  EXPECT_GE(relists, 1);
  EXPECT_LE(relists, 8);
  api_.expire_every_watch = false;
}

TEST_F(Extender, AClosedStderrDoesNotStopTheScheduler) {
  stop();
  start({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&-"});
  ASSERT_TRUE(eventually([&] { return api_.lists.at("pods") >= 2; }));
  api_.push("pods", {{"type", "ADDED"}, {"object", {{"metadata", 42}}}});  // reported
  api_.add_listed("pods", bound_pod("garbled", "gpu-c", 1, "{not json"));
  const int before = api_.lists.at("pods");
  ASSERT_TRUE(eventually([&] { return api_.lists.at("pods") > before; }));
  EXPECT_TRUE(whole_gpus_fit(1, "gpu-c"));
}

}  // namespace
}  // namespace tessera::test
