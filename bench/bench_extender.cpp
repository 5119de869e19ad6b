// The extender under load: `tessera scheduler` on the openb cluster (nodeCacheCapable, nodes
// listed from a fake API server), filter latency one request at a time and with many clients
// at once, for each scheduler binary given (a baseline and the build under test, in the same
// run). Prints medians of several rounds and the ratio of concurrent to sequential p99.
//
// Usage: bench_extender NODES_CSV PODS_CSV TESSERA [TESSERA...]
//        (env: CLIENTS=200, ROUNDS=5, REQUESTS=2000 per round)
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

// Lists the trace's nodes as Kubernetes nodes; no pods; watches that stay open and quiet.
class FakeApiServer {
 public:
  explicit FakeApiServer(const std::vector<NodeSpec>& nodes) {
    nlohmann::json list = {{"kind", "NodeList"}, {"metadata", {{"resourceVersion", "1"}}}};
    list["items"] = nlohmann::json::array();
    for (const NodeSpec& node : nodes) {
      nlohmann::json item = {{"metadata", {{"name", node.name}, {"resourceVersion", "1"}}},
                             {"status",
                              {{"allocatable",
                                {{"cpu", fmt::format("{}m", node.cpu_milli)},
                                 {"memory", fmt::format("{}Mi", node.memory_mib)}}}}}};
      if (node.gpus > 0) {
        item["metadata"]["annotations"][tessera::contract::kGpusAnnotation] = nlohmann::json{
            {"model", node.model}, {"count", node.gpus}, {"memory_mib", 32768}}.dump();
      }
      list["items"].push_back(item);
    }
    nodes_ = list.dump();
    server_.Get("/api/v1/nodes",
                [this](const httplib::Request& request, httplib::Response& response) {
                  answer(request, response, nodes_);
                });
    server_.Get("/api/v1/pods",
                [this](const httplib::Request& request, httplib::Response& response) {
                  answer(request, response,
                         R"({"kind":"PodList","metadata":{"resourceVersion":"1"},"items":[]})");
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
  std::string nodes_;
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

Round measure(int port, const std::vector<std::string>& bodies, int clients, int requests) {
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
        const auto reply = client.Post("/filter", bodies[i % bodies.size()], "application/json");
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s NODES_CSV PODS_CSV TESSERA [TESSERA...]\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  const int clients = env_int("CLIENTS", 200), rounds = env_int("ROUNDS", 5),
            requests = env_int("REQUESTS", 2000);
  const std::vector<NodeSpec> nodes = read_nodes(argv[1]);
  const std::vector<PodSpec> pods = read_pods(argv[2]);
  nlohmann::json names = nlohmann::json::array();
  for (const NodeSpec& node : nodes) names.push_back(node.name);
  std::vector<std::string> bodies;
  std::mt19937_64 random(7);
  for (int i = 0; i < 64; ++i) {
    const PodSpec& pod = pods[random() % pods.size()];
    nlohmann::json limits = {{"cpu", fmt::format("{}m", pod.cpu_milli)},
                             {"memory", fmt::format("{}Mi", pod.memory_mib)}};
    if (pod.gpus > 0) limits["nvidia.com/gpu"] = std::to_string(pod.gpus);
    if (pod.shares_gpu()) limits["nvidia.com/gpucores"] = std::to_string(pod.gpu_milli / 10);
    bodies.push_back(nlohmann::json{
        {"pod",
         {{"metadata",
           {{"name", pod.name}, {"namespace", "bench"}, {"uid", fmt::format("u{}", i)}}},
          {"spec",
           {{"containers",
             {{{"name", "c"}, {"resources", {{"limits", limits}, {"requests", limits}}}}}}}}}},
        {"nodenames",
         names}}.dump());
  }
  FakeApiServer api(nodes);
  std::printf(
      "| scheduler | 1 client: p50 ms | p99 ms | req/s | %d clients: p50 ms | p99 ms | req/s | "
      "failed | p99 ratio | p99 / (clients / cores x p50 of 1) |\n",
      clients);
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const double cores = std::thread::hardware_concurrency();
  for (int program = 3; program < argc; ++program) {
    const int port = free_port();
    const Scheduler scheduler(argv[program], api.url(), port);
    httplib::Client probe("127.0.0.1", port);
    // Ready once it has listed the nodes: a pod that fits anywhere passes some.
    const std::string probe_body = nlohmann::json{
        {"pod",
         {{"metadata", {{"name", "probe"}, {"namespace", "bench"}, {"uid", "probe"}}},
          {"spec", {{"containers", nlohmann::json::array()}}}}},
        {"nodenames", names}}.dump();
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    for (;;) {
      const auto reply = probe.Post("/filter", probe_body, "application/json");
      if (reply && reply->status == 200) {
        const auto passed = nlohmann::json::parse(reply->body)["NodeNames"];
        if (passed.is_array() && !passed.empty()) break;
      }
      if (Clock::now() > give_up) {
        throw std::runtime_error(std::string(argv[program]) + " never came up");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // starting up: poll
    }
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
