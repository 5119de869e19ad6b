// The extender under load: `tessera scheduler` on the openb cluster (nodeCacheCapable, nodes
// listed from a fake API server), filter latency one request at a time and with many clients
// at once, for each scheduler binary given (a baseline and the build under test, in the same
// run). Prints medians of several rounds and the ratio of concurrent to sequential p99.
//
// With --scale, a synthetic cluster at Kubernetes' own limits instead: NODES GPU nodes (the
// openb node types in turn) and PODS pods bound to them with their assignments, listed and
// watched through the fake API server. It reports the time from start until every pod is
// held, the scheduler's resident memory (now and at its peak), and filter, prioritize and
// preempt latency (p50 and p99) with one client and with CLIENTS at once; filter and
// prioritize name NAMES nodes (kube-scheduler's percentageOfNodesToScore leaves 10 % of 5,000,
// 500) or every node.
//
// Usage: bench_extender NODES_CSV PODS_CSV TESSERA [TESSERA...]
//        (env: CLIENTS=200, ROUNDS=5, REQUESTS=2000 per round)
//        bench_extender --scale NODES PODS NODE_TYPES_CSV TESSERA [TESSERA...]
//        (env: CLIENTS=50, ROUNDS=3, REQUESTS=400, NAMES=500)
#include <arpa/inet.h>
#include <fmt/core.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "contract/annotations.h"
#include "sched/trace.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using namespace tessera::sched;

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

// A Kubernetes node of the trace's shape: CPU and memory allocatable, its GPUs annotated.
nlohmann::json node_object(const NodeSpec& node) {
  nlohmann::json item = {{"metadata", {{"name", node.name}, {"resourceVersion", "1"}}},
                         {"status",
                          {{"allocatable",
                            {{"cpu", fmt::format("{}m", node.cpu_milli)},
                             {"memory", fmt::format("{}Mi", node.memory_mib)}}}}}};
  if (node.gpus > 0) {
    item["metadata"]["annotations"][tessera::contract::kGpusAnnotation] =
        nlohmann::json{{"model", node.model}, {"count", node.gpus}, {"memory_mib", 32768}}.dump();
  }
  return item;
}

std::string list_of(const char* kind, nlohmann::json items) {
  return nlohmann::json{
      {"kind", kind}, {"metadata", {{"resourceVersion", "1"}}}, {"items", std::move(items)}}
      .dump();
}

// Lists nodes and pods as given; watches that stay open and quiet.
class FakeApiServer {
 public:
  FakeApiServer(std::string nodes, std::string pods)
      : nodes_(std::move(nodes)), pods_(std::move(pods)) {
    server_.Get("/api/v1/nodes",
                [this](const httplib::Request& request, httplib::Response& response) {
                  answer(request, response, nodes_);
                });
    server_.Get("/api/v1/pods",
                [this](const httplib::Request& request, httplib::Response& response) {
                  answer(request, response, pods_);
                });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeApiServer() {
    stopping_ = true;
    server_.stop();
    thread_.join();
  }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }

 private:
  void answer(const httplib::Request& request, httplib::Response& response,
              const std::string& listed) {
    if (!request.has_param("watch")) {
      response.set_content(listed, "application/json");
      return;
    }
    response.set_chunked_content_provider(
        "application/json", [this](std::size_t, httplib::DataSink&) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a quiet watch
          return !stopping_.load();
        });
  }
  httplib::Server server_;
  std::string nodes_, pods_;
  std::atomic<bool> stopping_{false};
  int port_ = 0;
  std::thread thread_;
};

class Scheduler {
 public:
  Scheduler(const std::string& program, const std::string& api, int port) {
    const std::string listen = fmt::format("127.0.0.1:{}", port);
    std::vector<std::string> args = {program, "scheduler", "--listen", listen, "--api-server", api};
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, program.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
      throw std::runtime_error("cannot start " + program);
    }
  }
  ~Scheduler() {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// A port nobody listens on now (the scheduler is told it; a moment's race is fine here).
int free_port() {
  const int probe = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  if (bind(probe, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
      getsockname(probe, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    throw std::runtime_error("no free port");
  }
  close(probe);
  return ntohs(address.sin_port);
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<std::size_t>(p * values.size()))];
}

double median(std::vector<double> values) {
  return percentile(std::move(values), 0.5);
}

struct Round {
  double p50_ms, p99_ms, per_second;
  int failed;  // requests without a 200 answer (refused connections, timeouts)
};

Round measure(int port, const std::vector<std::string>& bodies, int clients, int requests,
              const std::string& verb = "/filter") {
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> next{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  const auto began = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", port);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);  // as Go's net/http, kube-scheduler's client, does
      client.set_read_timeout(30, 0);
      for (int i; (i = next++) < requests;) {
        const auto start = Clock::now();
        const auto reply = client.Post(verb, bodies[i % bodies.size()], "application/json");
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        if (!reply || reply->status != 200) ++failed;
        latencies[c].push_back(ms);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - began).count();
  std::vector<double> all;
  for (const auto& some : latencies) all.insert(all.end(), some.begin(), some.end());
  return {percentile(all, 0.5), percentile(all, 0.99), requests / seconds, failed.load()};
}

// Waits until the scheduler at `port` answers filter with some node for `probe_body` and
// `ready` (if given) holds; throws after `limit`.
void wait_ready(const std::string& program, int port, const std::string& probe_body,
                const std::function<bool(httplib::Client&)>& ready, std::chrono::seconds limit) {
  httplib::Client probe("127.0.0.1", port);
  probe.set_read_timeout(60, 0);
  const auto give_up = Clock::now() + limit;
  for (;;) {
    const auto reply = probe.Post("/filter", probe_body, "application/json");
    if (reply && reply->status == 200) {
      const auto passed = nlohmann::json::parse(reply->body)["NodeNames"];
      if (passed.is_array() && !passed.empty() && (!ready || ready(probe))) return;
    }
    if (Clock::now() > give_up) throw std::runtime_error(program + " never came up");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // starting up: poll
  }
}

std::string probe_body(const nlohmann::json& names) {
  return nlohmann::json{
      {"pod",
       {{"metadata", {{"name", "probe"}, {"namespace", "bench"}, {"uid", "probe"}}},
        {"spec", {{"containers", nlohmann::json::array()}}}}},
      {"nodenames", names}}
      .dump();
}

// A pod asking for what `pod` asks, as kube-scheduler sends it.
nlohmann::json pod_object(const PodSpec& pod, const std::string& uid, int priority = 0) {
  nlohmann::json limits = {{"cpu", fmt::format("{}m", pod.cpu_milli)},
                           {"memory", fmt::format("{}Mi", pod.memory_mib)}};
  if (pod.gpus > 0) limits["nvidia.com/gpu"] = std::to_string(pod.gpus);
  if (pod.shares_gpu()) limits["nvidia.com/gpucores"] = std::to_string(pod.gpu_milli / 10);
  return {{"metadata", {{"name", pod.name}, {"namespace", "bench"}, {"uid", uid}}},
          {"spec",
           {{"priority", priority},
            {"containers",
             {{{"name", "c"}, {"resources", {{"limits", limits}, {"requests", limits}}}}}}}}};
}

// Kilobytes of resident memory of a process now (VmRSS) and at its peak (VmHWM).
std::pair<long, long> resident_kib(pid_t pid) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  long now = -1, peak = -1;
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmRSS:")) now = std::atol(line.c_str() + 6);
    if (line.starts_with("VmHWM:")) peak = std::atol(line.c_str() + 6);
  }
  return {now, peak};
}

int run_openb(int argc, char** argv) {
  const int clients = env_int("CLIENTS", 200), rounds = env_int("ROUNDS", 5),
            requests = env_int("REQUESTS", 2000);
  const std::vector<NodeSpec> nodes = read_nodes(argv[1]);
  const std::vector<PodSpec> pods = read_pods(argv[2]);
  nlohmann::json names = nlohmann::json::array();
  nlohmann::json node_items = nlohmann::json::array();
  for (const NodeSpec& node : nodes) {
    names.push_back(node.name);
    node_items.push_back(node_object(node));
  }
  std::vector<std::string> bodies;
  std::mt19937_64 random(7);
  for (int i = 0; i < 64; ++i) {
    const PodSpec& pod = pods[random() % pods.size()];
    bodies.push_back(nlohmann::json{
        {"pod", pod_object(pod, fmt::format("u{}", i))},
        {"nodenames",
         names}}.dump());
  }
  FakeApiServer api(list_of("NodeList", std::move(node_items)), list_of("PodList", {}));
  std::printf(
      "| scheduler | 1 client: p50 ms | p99 ms | req/s | %d clients: p50 ms | p99 ms | req/s | "
      "failed | p99 ratio | p99 / (clients / cores x p50 of 1) |\n",
      clients);
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const double cores = std::thread::hardware_concurrency();
  for (int program = 3; program < argc; ++program) {
    const int port = free_port();
    const Scheduler scheduler(argv[program], api.url(), port);
    // Ready once it has listed the nodes: a pod that fits anywhere passes some.
    wait_ready(argv[program], port, probe_body(names), {}, std::chrono::seconds(30));
    std::vector<double> seq50, seq99, seq_rate, con50, con99, con_rate;
    int failed = 0;
    for (int r = 0; r < rounds; ++r) {
      const Round one = measure(port, bodies, 1, requests / 4);
      const Round many = measure(port, bodies, clients, requests);
      seq50.push_back(one.p50_ms);
      seq99.push_back(one.p99_ms);
      con50.push_back(many.p50_ms);
      con99.push_back(many.p99_ms);
      seq_rate.push_back(one.per_second);
      con_rate.push_back(many.per_second);
      failed += one.failed + many.failed;
    }
    // Little's law: with every client waiting, a request queues behind clients / cores others,
    // so that is the least the ratio can be on this machine; the last column is against it.
    std::printf("| %s | %.2f | %.2f | %.0f | %.2f | %.2f | %.0f | %d | %.1fx | %.2f |\n",
                argv[program], median(seq50), median(seq99), median(seq_rate), median(con50),
                median(con99), median(con_rate), failed, median(con99) / median(seq99),
                median(con99) / (clients / cores * median(seq50)));
    std::fflush(stdout);
  }
  return 0;
}

// The synthetic cluster: `count` nodes of the openb types in turn, and `pods` bound pods
// spread over them: on each node, GPU-sharing pods of half a GPU on every GPU, then CPU-only
// pods of half a core, as many as make the node's share of `pods`.
struct Synthetic {
  std::vector<NodeSpec> nodes;
  std::string node_list, pod_list;
  long gpu_pods = 0;
};

Synthetic synthetic_cluster(const std::vector<NodeSpec>& types, int count, long pods) {
  Synthetic cluster;
  nlohmann::json node_items = nlohmann::json::array(), pod_items = nlohmann::json::array();
  const long per_node = pods / count, extra = pods % count;
  for (int n = 0; n < count; ++n) {
    NodeSpec node = types[static_cast<std::size_t>(n) % types.size()];
    node.name = fmt::format("scale-{:05}", n);
    node_items.push_back(node_object(node));
    const long here = per_node + (n < extra ? 1 : 0);
    for (long p = 0; p < here; ++p) {
      const std::string name = fmt::format("p-{:05}-{:03}", n, p);
      const bool shares = p < 2L * node.gpus;
      nlohmann::json limits = {{"cpu", "500m"}, {"memory", "512Mi"}};
      nlohmann::json annotations = nlohmann::json::object();
      if (shares) {
        limits["nvidia.com/gpu"] = "1";
        limits["nvidia.com/gpucores"] = "50";
        annotations[tessera::contract::kAssignmentAnnotation] =
            nlohmann::json{{"node", node.name}, {"gpus", {p / 2}}, {"milli", 500}}.dump();
        ++cluster.gpu_pods;
      }
      pod_items.push_back(
          {{"metadata",
            {{"name", name},
             {"namespace", "bench"},
             {"uid", "uid-" + name},
             {"resourceVersion", "1"},
             {"annotations", annotations}}},
           {"spec",
            {{"nodeName", node.name},
             {"priority", p % 3 == 0 ? 0 : 1000},
             {"containers",
              {{{"name", "c"}, {"resources", {{"limits", limits}, {"requests", limits}}}}}}}},
           {"status", {{"phase", "Running"}}}});
    }
    cluster.nodes.push_back(node);
  }
  cluster.node_list = list_of("NodeList", std::move(node_items));
  cluster.pod_list = list_of("PodList", std::move(pod_items));
  return cluster;
}

int run_scale(int argc, char** argv) {
  const int count = std::atoi(argv[2]);
  const long pods = std::atol(argv[3]);
  const int clients = env_int("CLIENTS", 50), rounds = env_int("ROUNDS", 3),
            requests = env_int("REQUESTS", 400), named = env_int("NAMES", 500);
  if (count <= 0 || pods < 0) throw std::runtime_error("--scale NODES PODS: NODES must be > 0");
  std::vector<NodeSpec> types;
  for (const NodeSpec& node : read_nodes(argv[4])) {
    if (node.gpus > 0) types.push_back(node);
  }
  const auto built = Clock::now();
  const Synthetic cluster = synthetic_cluster(types, count, pods);
  std::fprintf(stderr,
               "cluster: %d nodes, %ld pods (%ld holding GPUs), lists of %.0f + %.0f MB, "
               "built in %.1f s\n",
               count, pods, cluster.gpu_pods, cluster.node_list.size() / 1e6,
               cluster.pod_list.size() / 1e6,
               std::chrono::duration<double>(Clock::now() - built).count());
  nlohmann::json every = nlohmann::json::array();
  for (const NodeSpec& node : cluster.nodes) every.push_back(node.name);
  // Request bodies: pods of the openb sizes, on NAMES nodes from a varying start, or on all.
  auto kind = [](const char* name, std::int64_t cpu, std::int64_t memory, int gpus, int milli) {
    PodSpec pod;
    pod.name = name;
    pod.cpu_milli = cpu;
    pod.memory_mib = memory;
    pod.gpus = gpus;
    pod.gpu_milli = milli;
    return pod;
  };
  const std::vector<PodSpec> kinds = {
      kind("half", 4000, 8192, 1, 500), kind("whole", 8000, 16384, 1, 1000),
      kind("two", 16000, 32768, 2, 1000), kind("cpu", 2000, 4096, 0, 0)};
  auto bodies_for = [&](int names) {
    std::vector<std::string> bodies;
    for (int i = 0; i < 32; ++i) {
      nlohmann::json some = nlohmann::json::array();
      for (int k = 0; k < names; ++k) some.push_back(every[(i * 997 + k) % every.size()]);
      bodies.push_back(nlohmann::json{
          {"pod", pod_object(kinds[i % kinds.size()], fmt::format("u{}", i))},
          {"nodenames",
           some}}.dump());
    }
    return bodies;
  };
  const std::vector<std::string> some_nodes = bodies_for(std::min<int>(named, count));
  const std::vector<std::string> all_nodes = bodies_for(count);
  // Preempt: a high-priority whole-GPU pod, with kube-scheduler's candidates (NAMES nodes).
  std::vector<std::string> preempt_bodies;
  for (int i = 0; i < 32; ++i) {
    nlohmann::json candidates = nlohmann::json::object();
    for (int k = 0; k < std::min<int>(named, count); ++k) {
      candidates[every[(i * 997 + k) % every.size()].get<std::string>()] = {
          {"Pods", nlohmann::json::array()}, {"NumPDBViolations", 0}};
    }
    preempt_bodies.push_back(nlohmann::json{
        {"Pod", pod_object(kinds[1], fmt::format("urgent{}", i), 100000)},
        {"NodeNameToMetaVictims",
         candidates}}.dump());
  }
  const FakeApiServer api(cluster.node_list, cluster.pod_list);
  for (int program = 5; program < argc; ++program) {
    const int port = free_port();
    const auto started = Clock::now();
    const Scheduler scheduler(argv[program], api.url(), port);
    // Ready once every GPU pod is held.
    wait_ready(
        argv[program], port, probe_body(every),
        [&](httplib::Client& client) {
          const auto metrics = client.Get("/metrics");
          if (!metrics || metrics->status != 200) return false;
          const std::string key = "\ntessera_extender_pods_holding_gpus ";
          const auto at = metrics->body.find(key);
          return at != std::string::npos &&
                 std::atol(metrics->body.c_str() + at + key.size()) >= cluster.gpu_pods;
        },
        std::chrono::seconds(600));
    const double start_s = std::chrono::duration<double>(Clock::now() - started).count();
    const auto [rss_kib, peak_kib] = resident_kib(scheduler.pid());
    std::printf(
        "%s: %d nodes, %ld pods: ready (every pod held) in %.1f s; RSS %.0f MiB, peak "
        "%.0f MiB\n\n",
        argv[program], count, pods, start_s, rss_kib / 1024.0, peak_kib / 1024.0);
    std::printf(
        "| verb | nodes named | 1 client p50 / p99 ms | %d clients p50 / p99 ms | failed |\n",
        clients);
    std::printf("|---|---|---|---|---|\n");
    struct Case {
      const char* verb;
      const std::vector<std::string>* bodies;
      int names;
    };
    for (const Case& each :
         {Case{"/filter", &some_nodes, std::min(named, count)}, Case{"/filter", &all_nodes, count},
          Case{"/prioritize", &some_nodes, std::min(named, count)},
          Case{"/prioritize", &all_nodes, count},
          Case{"/preempt", &preempt_bodies, std::min(named, count)}}) {
      std::vector<double> one50, one99, many50, many99;
      int failed = 0;
      for (int r = 0; r < rounds; ++r) {
        const Round one = measure(port, *each.bodies, 1, requests / 4, each.verb);
        const Round many = measure(port, *each.bodies, clients, requests, each.verb);
        one50.push_back(one.p50_ms);
        one99.push_back(one.p99_ms);
        many50.push_back(many.p50_ms);
        many99.push_back(many.p99_ms);
        failed += one.failed + many.failed;
      }
      std::printf("| %s | %d | %.2f / %.2f | %.1f / %.1f | %d |\n", each.verb + 1, each.names,
                  median(one50), median(one99), median(many50), median(many99), failed);
      std::fflush(stdout);
    }
    const auto [after_kib, after_peak_kib] = resident_kib(scheduler.pid());
    std::printf("\nafter the requests: RSS %.0f MiB, peak %.0f MiB\n", after_kib / 1024.0,
                after_peak_kib / 1024.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  try {
    if (argc >= 6 && std::string(argv[1]) == "--scale") return run_scale(argc, argv);
    if (argc >= 4 && std::string(argv[1]) != "--scale") return run_openb(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: %s NODES_CSV PODS_CSV TESSERA [TESSERA...]\n"
               "       %s --scale NODES PODS NODE_TYPES_CSV TESSERA [TESSERA...]\n",
               argv[0], argv[0]);
  return 2;
}
