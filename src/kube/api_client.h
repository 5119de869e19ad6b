// A small Kubernetes API client over libcurl: bearer token, a CA file (or none on loopback),
// a timeout on every call, and retries with backoff on connection errors, 429 and 5xx.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

#include "base/status.h"

namespace tessera::kube {

struct ApiResponse {
  long status = 0;  // 0: no answer (connection failed or timed out)
  std::string body;
  std::string error;  // libcurl's reason when status is 0
};

struct ApiClientOptions {
  std::string server{};   // e.g. https://kubernetes.default.svc
  std::string token{};    // bearer token; empty: none
  std::string ca_file{};  // empty: the system's
  int timeout_ms = 5000;  // per attempt
  int attempts = 3;
};

// Answers larger than this are cut off with an error (a list of every pod of a large cluster
// is a few hundred MiB at most); so are watch events.
inline constexpr std::size_t kMostAnswerBytes = std::size_t{1} << 30;
inline constexpr std::size_t kMostEventBytes = std::size_t{64} << 20;

// Where the API server is and how to prove who is asking.
struct Connection {
  std::string server{};      // empty: the cluster's own (the process runs in a pod)
  std::string token_file{};  // empty: the service account's, in a pod
  std::string ca_file{};     // empty: the service account's, in a pod; else the system's
  int timeout_ms = 5000;
};
// Whether this process runs in a pod, as the API server's service variables say.
bool in_cluster();
// Client options for `connection`: in a pod, KUBERNETES_SERVICE_HOST and _PORT and the
// service account's token and CA fill what it leaves empty. A failure when no server is given
// outside a cluster, or a file cannot be read.
base::Status client_options(const Connection& connection, ApiClientOptions& options);

using Deadline = std::chrono::steady_clock::time_point;

class ApiClient {
 public:
  explicit ApiClient(ApiClientOptions options);
  // Each call gives up at `deadline` whatever its attempts and timeout would allow.
  ApiResponse get(const std::string& path, Deadline deadline = Deadline::max()) const;
  ApiResponse post(const std::string& path, const std::string& json,
                   Deadline deadline = Deadline::max()) const;
  // Replaces the object at `path`; the API server refuses (409) a stale resourceVersion.
  ApiResponse put(const std::string& path, const std::string& json,
                  Deadline deadline = Deadline::max()) const;
  // Deletes the object at `path`.
  ApiResponse remove(const std::string& path, Deadline deadline = Deadline::max()) const;
  // A JSON merge patch (application/merge-patch+json).
  ApiResponse patch(const std::string& path, const std::string& json,
                    Deadline deadline = Deadline::max()) const;
  // A watch (`path` asks for one): hands each line of the streamed answer (one event) to
  // on_event until the server ends the stream, on_event returns false, or `stop` is set. No
  // overall timeout; a connection silent for `idle_seconds` is dropped. Not retried: the
  // caller lists again.
  ApiResponse watch(const std::string& path,
                    const std::function<bool(const std::string&)>& on_event,
                    const std::atomic<bool>& stop, int idle_seconds) const;

 private:
  // A handle set up for path with the client's server, credentials and headers.
  struct Prepared;
  ApiResponse call(const char* method, const std::string& path, const std::string* body,
                   const char* content_type, Deadline deadline) const;
  ApiClientOptions options_;
};

}  // namespace tessera::kube
