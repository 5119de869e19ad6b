// tessera scheduler: the kube-scheduler extender over HTTP.
#include <fmt/core.h>
#include <httplib.h>

#include <atomic>
#include <charconv>
#include <string_view>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "cli/commands.h"
#include "sched/extender.h"

namespace tessera::cli {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream input(path);
  if (!input) throw std::runtime_error(fmt::format("cannot read {}", path));
  std::stringstream text;
  text << input.rdbuf();
  std::string content = text.str();
  while (!content.empty() && (content.back() == '\n' || content.back() == '\r')) content.pop_back();
  return content;
}

httplib::Server* running_server = nullptr;

void stop_serving(int) {
  if (running_server != nullptr) running_server->stop();
}

}  // namespace

int scheduler_command(const SchedulerOptions& options) {
  sched::Policy policy;
  try {
    policy = sched::parse_policy(options.policy);
  } catch (const std::invalid_argument& error) {
    throw UsageError(fmt::format("--policy: {}", error.what()));
  }
  const std::size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon != std::string::npos) {
    const std::string_view digits = std::string_view(options.listen).substr(colon + 1);
    const auto [end, failure] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (digits.empty() || failure != std::errc() || end != digits.data() + digits.size()) port = -1;
  }
  if (colon == std::string::npos || colon == 0 || port < 0 || port > 65535) {
    throw UsageError(
        fmt::format("--listen '{}' is not HOST:PORT with PORT from 0 to 65535", options.listen));
  }
  const std::string host = options.listen.substr(0, colon);

  sched::ApiClientOptions api;
  api.server = options.api_server;
  api.timeout_ms = options.timeout_ms;
  constexpr const char* kServiceAccount = "/var/run/secrets/kubernetes.io/serviceaccount";
  if (api.server.empty()) {  // inside a cluster: the service account
    const char* service_host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* service_port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (service_host == nullptr || service_port == nullptr) {
      throw UsageError("--api-server is required outside a cluster");
    }
    api.server = fmt::format("https://{}:{}", service_host, service_port);
    api.ca_file = std::string(kServiceAccount) + "/ca.crt";
    api.token = read_file(std::string(kServiceAccount) + "/token");
  }
  if (!options.token_file.empty()) api.token = read_file(options.token_file);
  if (!options.ca_file.empty()) api.ca_file = options.ca_file;

  sched::Extender extender(policy, std::make_unique<sched::ApiClient>(api));
  std::string error;
  if (!extender.sync(error)) fmt::print(stderr, "tessera scheduler: {} (will retry)\n", error);

  httplib::Server server;
  auto handle = [&](auto verb) {
    return [&extender, verb](const httplib::Request& request, httplib::Response& response) {
      const sched::HttpReply reply = (extender.*verb)(request.body);
      response.status = reply.status;
      response.set_content(reply.body, "application/json");
    };
  };
  server.Post(options.url_prefix + "/filter", handle(&sched::Extender::filter));
  server.Post(options.url_prefix + "/prioritize", handle(&sched::Extender::prioritize));
  server.Post(options.url_prefix + "/bind", handle(&sched::Extender::bind));
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok", "text/plain");
  });
  const int bound =
      port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound < 0) throw std::runtime_error(fmt::format("cannot listen on {}", options.listen));
  fmt::print("tessera scheduler: listening on {}:{}\n", host, bound);
  std::fflush(stdout);

  // What others allocate and release, and nodes coming and going, are watched.
  std::atomic<bool> stopping{false};
  auto report = [](const std::string& failure) {
    fmt::print(stderr, "tessera scheduler: {}\n", failure);
  };
  std::thread pods([&] { extender.follow(sched::Extender::Resource::pods, stopping, report); });
  std::thread nodes([&] { extender.follow(sched::Extender::Resource::nodes, stopping, report); });
  running_server = &server;
  std::signal(SIGTERM, stop_serving);
  std::signal(SIGINT, stop_serving);
  server.listen_after_bind();
  stopping = true;
  pods.join();
  nodes.join();
  return 0;
}

}  // namespace tessera::cli
