#include "kube/api_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string_view>
#include <thread>

namespace tessera::kube {
namespace {

std::size_t append(char* data, std::size_t size, std::size_t count, void* out) {
  auto& body = *static_cast<std::string*>(out);
  if (body.size() + size * count > kMostAnswerBytes) return 0;  // ends the transfer: an error
  body.append(data, size * count);
  return size * count;
}

bool worth_retrying(const ApiResponse& response) {
  return response.status == 0 || response.status == 429 || response.status >= 500;
}

constexpr const char* kServiceAccount = "/var/run/secrets/kubernetes.io/serviceaccount";
constexpr std::size_t kMostTokenBytes = 64 << 10;  // a service account's JWT is a few KiB

// A token file's content without its final line break; a failure if it cannot be read or is
// larger than any token.
base::Status read_token(const std::string& path, std::string& token) {
  std::ifstream input(path, std::ios::binary);
  if (!input) {
    return base::Status::failure("cannot read the token file " + path);
  }
  token.assign(kMostTokenBytes + 1, '\0');
  input.read(token.data(), static_cast<std::streamsize>(token.size()));
  token.resize(static_cast<std::size_t>(input.gcount()));
  if (token.size() > kMostTokenBytes) {
    return base::Status::failure("the token file " + path + " is larger than any token");
  }
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.find_first_of("\r\n") != std::string::npos || token.find('\0') != std::string::npos) {
    // No header injection.
    return base::Status::failure("the token file " + path + " holds more than one line");
  }
  return base::Status::success();
}

}  // namespace

bool in_cluster() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  return host != nullptr && port != nullptr && *host != '\0' && *port != '\0';
}

base::Status client_options(const Connection& connection, ApiClientOptions& options) {
  options.server = connection.server;
  options.timeout_ms = connection.timeout_ms;
  std::string token_file = connection.token_file;
  options.ca_file = connection.ca_file;
  if (options.server.empty()) {  // inside a cluster: the service account
    if (!in_cluster()) {
      return base::Status::failure(
          "no API server given, and not in a cluster (KUBERNETES_SERVICE_HOST is not set)");
    }
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    const bool ipv6 = std::string_view(host).find(':') != std::string_view::npos;
    options.server =
        std::string("https://") + (ipv6 ? "[" : "") + host + (ipv6 ? "]" : "") + ":" + port;
    if (token_file.empty()) token_file = std::string(kServiceAccount) + "/token";
    if (options.ca_file.empty()) options.ca_file = std::string(kServiceAccount) + "/ca.crt";
  }
  options.token.clear();
  return token_file.empty() ? base::Status::success() : read_token(token_file, options.token);
}

ApiClient::ApiClient(ApiClientOptions options) : options_(std::move(options)) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct ApiClient::Prepared {
  CURL* curl = nullptr;
  curl_slist* headers = nullptr;
  Prepared(const ApiClientOptions& options, const char* method, const std::string& path,
           const char* content_type) {
    curl = curl_easy_init();
    if (curl == nullptr) return;
    headers = curl_slist_append(nullptr, "Accept: application/json");
    if (content_type != nullptr) {
      headers = curl_slist_append(headers, (std::string("Content-Type: ") + content_type).c_str());
    }
    if (!options.token.empty()) {
      headers = curl_slist_append(headers, ("Authorization: Bearer " + options.token).c_str());
    }
    curl_easy_setopt(curl, CURLOPT_URL, (options.server + path).c_str());
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.timeout_ms));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (!options.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options.ca_file.c_str());
  }
  ~Prepared() {
    curl_slist_free_all(headers);
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;
  // Runs the request; fills the status, or the reason there is none.
  void perform(ApiResponse& response) {
    const CURLcode code = curl_easy_perform(curl);
    if (code == CURLE_OK) {
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
    } else {
      response.error = curl_easy_strerror(code);
    }
  }
};

ApiResponse ApiClient::call(const char* method, const std::string& path, const std::string* body,
                            const char* content_type, Deadline deadline) const {
  using std::chrono::milliseconds;
  ApiResponse response;
  for (int attempt = 0; attempt < options_.attempts; ++attempt) {
    if (attempt > 0) {  // 100 ms, 200 ms, ...: give a restarting API server time
      const auto pause = milliseconds(100 << std::min(attempt - 1, 6));
      if (std::chrono::steady_clock::now() + pause >= deadline) break;
      std::this_thread::sleep_for(pause);
    }
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    const long timeout_ms = deadline == Deadline::max()
                                ? options_.timeout_ms
                                : std::min<long>(options_.timeout_ms, left.count());
    if (timeout_ms <= 0) {
      if (attempt == 0) response.error = "no time left before the deadline";
      break;
    }
    Prepared request(options_, method, path, content_type);
    if (request.curl == nullptr) return {0, {}, "curl_easy_init failed"};
    response = ApiResponse{};
    curl_easy_setopt(request.curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(request.curl, CURLOPT_WRITEFUNCTION, append);
    curl_easy_setopt(request.curl, CURLOPT_WRITEDATA, &response.body);
    if (body != nullptr) {
      curl_easy_setopt(request.curl, CURLOPT_POSTFIELDS, body->c_str());
      curl_easy_setopt(request.curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body->size()));
    }
    request.perform(response);
    if (!worth_retrying(response)) break;
  }
  return response;
}

ApiResponse ApiClient::watch(const std::string& path,
                             const std::function<bool(const std::string&)>& on_event,
                             const std::atomic<bool>& stop, int idle_seconds) const {
  struct Stream {
    const std::function<bool(const std::string&)>* on_event;
    const std::atomic<bool>* stop;
    std::string pending;  // a line not yet complete
    std::string* body;    // kept short: only an answer that is not a stream matters
  };
  ApiResponse response;
  Prepared request(options_, "GET", path, nullptr);
  if (request.curl == nullptr) return {0, {}, "curl_easy_init failed"};
  Stream stream{&on_event, &stop, {}, &response.body};
  curl_easy_setopt(
      request.curl, CURLOPT_WRITEFUNCTION,
      +[](char* data, std::size_t size, std::size_t count, void* out) -> std::size_t {
        auto& lines = *static_cast<Stream*>(out);
        const std::size_t searched = lines.pending.size();
        lines.pending.append(data, size * count);
        // Complete lines are handed over; what is left is the start of the next one.
        std::size_t start = 0;
        for (std::size_t end;
             (end = lines.pending.find('\n', std::max(start, searched))) != std::string::npos;
             start = end + 1) {
          const std::string_view line(lines.pending.data() + start, end - start);
          if (lines.body->size() < 4096) lines.body->append(line.substr(0, 4096));
          if (line.empty()) continue;
          bool more = false;
          try {  // nothing may be thrown through libcurl
            more = (*lines.on_event)(std::string(line));
          } catch (...) {
          }
          if (!more) return 0;  // ends the transfer
        }
        lines.pending.erase(0, start);
        if (lines.pending.size() > kMostEventBytes) return 0;  // no event is this large
        return size * count;
      });
  curl_easy_setopt(request.curl, CURLOPT_WRITEDATA, &stream);
  // Checked about once a second even when nothing arrives: a stop ends the watch.
  curl_easy_setopt(request.curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(
      request.curl, CURLOPT_XFERINFOFUNCTION,
      +[](void* out, curl_off_t, curl_off_t, curl_off_t, curl_off_t) -> int {
        return static_cast<Stream*>(out)->stop->load() ? 1 : 0;
      });
  curl_easy_setopt(request.curl, CURLOPT_XFERINFODATA, &stream);
  curl_easy_setopt(request.curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(request.curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(idle_seconds));
  request.perform(response);
  return response;
}

ApiResponse ApiClient::get(const std::string& path, Deadline deadline) const {
  return call("GET", path, nullptr, nullptr, deadline);
}

ApiResponse ApiClient::post(const std::string& path, const std::string& json,
                            Deadline deadline) const {
  return call("POST", path, &json, "application/json", deadline);
}

ApiResponse ApiClient::put(const std::string& path, const std::string& json,
                           Deadline deadline) const {
  return call("PUT", path, &json, "application/json", deadline);
}

ApiResponse ApiClient::remove(const std::string& path, Deadline deadline) const {
  return call("DELETE", path, nullptr, nullptr, deadline);
}

ApiResponse ApiClient::patch(const std::string& path, const std::string& json,
                             Deadline deadline) const {
  return call("PATCH", path, &json, "application/merge-patch+json", deadline);
}

}  // namespace tessera::kube
