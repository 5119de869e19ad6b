#include "sched/api_client.h"

#include <curl/curl.h>

#include <chrono>
#include <thread>

namespace tessera::sched {
namespace {

std::size_t append(char* data, std::size_t size, std::size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

bool worth_retrying(const ApiResponse& response) {
  return response.status == 0 || response.status == 429 || response.status >= 500;
}

}  // namespace

ApiClient::ApiClient(ApiClientOptions options) : options_(std::move(options)) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

ApiResponse ApiClient::call(const char* method, const std::string& path, const std::string* body,
                            const char* content_type) const {
  ApiResponse response;
  for (int attempt = 0; attempt < options_.attempts; ++attempt) {
    if (attempt > 0) {  // 100 ms, 200 ms, ...: give a restarting API server time
      std::this_thread::sleep_for(std::chrono::milliseconds(100 << (attempt - 1)));
    }
    CURL* curl = curl_easy_init();
    if (curl == nullptr) return {0, {}, "curl_easy_init failed"};
    response = ApiResponse{};
    const std::string url = options_.server + path;
    curl_slist* headers = curl_slist_append(nullptr, "Accept: application/json");
    if (content_type != nullptr) {
      headers = curl_slist_append(headers, (std::string("Content-Type: ") + content_type).c_str());
    }
    if (!options_.token.empty()) {
      headers = curl_slist_append(headers, ("Authorization: Bearer " + options_.token).c_str());
    }
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout_ms));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.timeout_ms));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
    if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
    if (body != nullptr) {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body->c_str());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body->size()));
    }
    const CURLcode code = curl_easy_perform(curl);
    if (code == CURLE_OK) {
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
    } else {
      response.error = curl_easy_strerror(code);
    }
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (!worth_retrying(response)) break;
  }
  return response;
}

ApiResponse ApiClient::get(const std::string& path) const {
  return call("GET", path, nullptr, nullptr);
}

ApiResponse ApiClient::post(const std::string& path, const std::string& json) const {
  return call("POST", path, &json, "application/json");
}

ApiResponse ApiClient::patch(const std::string& path, const std::string& json) const {
  return call("PATCH", path, &json, "application/merge-patch+json");
}

}  // namespace tessera::sched
