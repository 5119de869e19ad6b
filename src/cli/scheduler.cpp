// tessera scheduler: the kube-scheduler extender over HTTP.
#include <fmt/core.h>
#include <httplib.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/serving_certificate.h"
#include "extender/extender.h"
#include "kube/api_cluster.h"
#include "kube/lease.h"

namespace tessera::cli {
namespace {

const base::ProgramLog& scheduler_log() {
  static const base::ProgramLog log("scheduler");
  return log;
}

// What the scheduler's parts report: failures of the API server, objects that cannot be
// read, certificates that cannot be used. Never throws.
void report(const std::string& failure) {
  scheduler_log().warning(failure);
}

// How the HTTP server meets slow and idle clients: enough threads that a few of them cannot
// stall kube-scheduler's requests, and timeouts that hand their threads back.
constexpr std::size_t kServerThreads = 64;
constexpr std::size_t kMostBodyBytes = std::size_t{64} << 20;  // whole Node lists of big clusters
constexpr int kReadTimeoutSeconds = 5, kWriteTimeoutSeconds = 5, kIdleKeepAliveSeconds = 2;

std::string environment_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("tessera");
}

std::chrono::milliseconds from_seconds(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

// Where the Lease is and how this replica takes part, from the options; refuses settings that
// could let two replicas bind at once.
kube::LeaseSettings lease_settings(const SchedulerOptions& options) {
  kube::LeaseSettings settings;
  settings.name = options.lease_name;
  settings.namespace_name = options.lease_namespace.empty()
                                ? environment_or("POD_NAMESPACE", "kube-system")
                                : options.lease_namespace;
  settings.identity = options.leader_identity.empty() ? environment_or("POD_NAME", host_name())
                                                      : options.leader_identity;
  settings.duration = std::chrono::seconds(options.lease_duration_s);
  settings.renew_deadline = from_seconds(options.renew_deadline_s);
  settings.retry_period = from_seconds(options.retry_period_s);
  settings.follow = options.lease_follow;
  if (const std::string why = kube::why_not_valid(settings); !why.empty()) {
    throw UsageError(fmt::format("leader election: {}", why));
  }
  return settings;
}

// The HTTP server, or with a certificate and key the HTTPS one, which serves the files as they
// are at each handshake (`certificate` holds them); refuses files it cannot use now.
std::unique_ptr<httplib::Server> make_server(const SchedulerOptions& options,
                                             std::unique_ptr<ServingCertificate>& certificate) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    throw UsageError("--tls-cert-file and --tls-key-file go together");
  }
  if (options.tls_cert_file.empty()) return std::make_unique<httplib::Server>();
  certificate =
      std::make_unique<ServingCertificate>(options.tls_cert_file, options.tls_key_file, report);
  auto server = std::make_unique<httplib::SSLServer>(
      [&certificate](SSL_CTX& context) { return certificate->configure(context); });
  if (!server->is_valid()) throw std::runtime_error("cannot set up TLS (OpenSSL refused)");
  return server;
}

}  // namespace

void split_listen_address(const std::string& text, const char* option, std::string& host,
                          int& port) {
  const std::size_t colon = text.rfind(':');
  port = -1;
  if (colon != std::string::npos) {
    const std::string_view digits = std::string_view(text).substr(colon + 1);
    const auto [end, failure] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (digits.empty() || failure != std::errc() || end != digits.data() + digits.size()) port = -1;
  }
  if (colon == std::string::npos || colon == 0 || port < 0 || port > 65535) {
    throw UsageError(
        fmt::format("{} '{}' is not HOST:PORT with PORT from 0 to 65535", option, text));
  }
  host = text.substr(0, colon);
}

int scheduler_command(const SchedulerOptions& options) {
  sched::Policy policy;
  try {
    policy = sched::parse_policy(options.policy);
  } catch (const std::invalid_argument& error) {
    throw UsageError(fmt::format("--policy: {}", error.what()));
  }
  std::string host;
  int port = -1;
  split_listen_address(options.listen, "--listen", host, port);
  const bool elects = options.leader_elect || options.lease_follow;
  const kube::LeaseSettings lease = elects ? lease_settings(options) : kube::LeaseSettings{};
  std::unique_ptr<ServingCertificate> certificate;  // outlives the server, which asks it
  const std::unique_ptr<httplib::Server> serving = make_server(options, certificate);
  httplib::Server& server = *serving;

  kube::ApiClientOptions api;
  const base::Status configured = kube::client_options({.server = options.api_server,
                                                        .token_file = options.token_file,
                                                        .ca_file = options.ca_file,
                                                        .timeout_ms = options.timeout_ms},
                                                       api);
  if (!configured.ok()) {
    if (options.api_server.empty() && !kube::in_cluster()) {
      throw UsageError("--api-server is required outside a cluster");
    }
    throw std::runtime_error(configured.message());
  }

  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-answer is an error, not a signal
  // SIGTERM and SIGINT are taken by one thread (sigwait), whenever they come: blocked here,
  // before any thread starts, so that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  extender::Extender extender(policy, std::make_unique<kube::ApiCluster>(api), report);
  if (const base::Status synced = extender.sync(); !synced.ok()) {
    report(synced.message() + " (will retry)");
  }
  const kube::ApiCluster election_cluster(api);
  std::unique_ptr<kube::LeaderElector> elector;
  if (elects) {
    elector = std::make_unique<kube::LeaderElector>(election_cluster, lease, report);
    extender.bind_only_while([&elector] { return elector->leading(); });
  }

  server.new_task_queue = [] { return new httplib::ThreadPool(kServerThreads); };
  server.set_payload_max_length(kMostBodyBytes);
  server.set_read_timeout(kReadTimeoutSeconds, 0);
  server.set_write_timeout(kWriteTimeoutSeconds, 0);
  server.set_keep_alive_timeout(kIdleKeepAliveSeconds);
  // Answers go out at once: with Nagle's algorithm a reply written in parts waits for the
  // client's delayed ACK (40 ms on Linux).
  server.set_tcp_nodelay(true);
  auto handle = [&](auto verb) {
    return [&extender, verb](const httplib::Request& request, httplib::Response& response) {
      extender::HttpReply reply;
      try {
        reply = (extender.*verb)(request.body);
      } catch (const std::exception& failure) {  // a defect: said, and answered
        report(fmt::format("{} failed: {}", request.path, failure.what()));
        reply = {500, R"({"Error":"internal error; see the scheduler's log"})"};
      }
      response.status = reply.status;
      response.set_content(reply.body, "application/json");
      // A large body leaves the heap large: give the memory back to the system.
      if (request.body.size() > (std::size_t{1} << 20)) malloc_trim(0);
    };
  };
  server.Post(options.url_prefix + "/filter", handle(&extender::Extender::filter));
  server.Post(options.url_prefix + "/prioritize", handle(&extender::Extender::prioritize));
  server.Post(options.url_prefix + "/bind", handle(&extender::Extender::bind));
  server.Post(options.url_prefix + "/preempt", handle(&extender::Extender::preempt));
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok", "text/plain");
  });
  server.Get("/metrics", [&extender](const httplib::Request&, httplib::Response& response) {
    response.set_content(extender.metrics(), "text/plain; version=0.0.4");
  });
  // httplib listens with a backlog of 5: a burst of connections beyond it waits a second for
  // the SYN to be sent again. The listening socket's backlog is raised once it is bound.
  int listening_socket = -1;
  server.set_socket_options([&listening_socket](socket_t socket) {
    httplib::default_socket_options(socket);
    listening_socket = socket;
  });
  const int bound =
      port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound < 0) throw std::runtime_error(fmt::format("cannot listen on {}", options.listen));
  if (listening_socket >= 0) ::listen(listening_socket, SOMAXCONN);
  const std::string listening = fmt::format("tessera scheduler: listening on {}:{}\n", host, bound);
  std::fputs(listening.c_str(), stdout);
  std::fflush(stdout);

  // What others allocate and release, and nodes coming and going, are watched.
  std::atomic<bool> stopping{false};
  std::thread pods([&] { extender.follow(extender::Extender::Resource::pods, stopping, report); });
  std::thread nodes(
      [&] { extender.follow(extender::Extender::Resource::nodes, stopping, report); });
  // A replica that comes to lead lists everything again first: the last leader's binds may
  // not have reached its watches yet.
  std::thread election([&] {
    if (!elector) return;
    elector->run(stopping, [&](bool leading) {
      if (!leading) {
        scheduler_log().info(
            fmt::format("no longer the leader (lease {}/{})", lease.namespace_name, lease.name));
        return true;
      }
      if (const base::Status synced = extender.sync(); !synced.ok()) {
        report(synced.message() + " (not leading until the state is read)");
        return false;
      }
      scheduler_log().info(fmt::format("leading as {} (lease {}/{})", lease.identity,
                                       lease.namespace_name, lease.name));
      return true;
    });
  });
  std::atomic<bool> served{false};
  std::thread signals([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    stopping = true;
    // A signal that comes before the server runs would be lost on it: asked until it ends.
    while (!served) {
      server.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  server.listen_after_bind();
  served = true;
  if (!stopping) kill(getpid(), SIGTERM);  // ended by itself: the signal thread ends too
  signals.join();
  stopping = true;
  pods.join();
  nodes.join();
  election.join();
  return 0;
}

}  // namespace tessera::cli
