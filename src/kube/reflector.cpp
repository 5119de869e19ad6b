#include "kube/reflector.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "kube/json_input.h"

namespace tessera::kube {
namespace {

using Clock = std::chrono::steady_clock;

std::string version_of(const nlohmann::json& object) {
  return string_at(object, "/metadata/resourceVersion"_json_pointer);
}

// Sleeps for `length` unless `stop` is set first.
void pause_for(std::chrono::milliseconds length, const std::atomic<bool>& stop) {
  const auto until = Clock::now() + length;
  while (!stop && Clock::now() < until) {
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(100), until - Clock::now()));
  }
}

}  // namespace

base::Status list_collection(const Cluster& cluster, const Collection& collection,
                             const CollectionHandlers& handlers, std::string& version) {
  const ApiResponse listed = cluster.list(collection, Deadline::max());
  if (listed.status != 200) {
    return base::Status::failure(fmt::format("listing {} failed: HTTP {} {}", collection.describe(),
                                             listed.status, listed.error));
  }
  try {
    const nlohmann::json body = parse_outside_json(listed.body);
    if (!body.is_object() || !body.contains("items") || !body["items"].is_array()) {
      throw std::runtime_error("it has no items array");
    }
    version = version_of(body);
    handlers.replace(body["items"]);
  } catch (const std::exception& failure) {
    return base::Status::failure(fmt::format("the API server's list of {} is malformed: {}",
                                             collection.describe(), failure.what()));
  }
  return base::Status::success();
}

WatchEnd apply_watch_line(const std::string& line, const CollectionHandlers& handlers,
                          std::string& version, std::string& why) {
  std::string type;
  nlohmann::json event;
  try {
    event = parse_outside_json(line);
  } catch (const std::exception& error) {
    why = fmt::format("an event cannot be read: {}", error.what());
    return WatchEnd::broken;
  }
  if (!event.is_object() || !event.contains("type") || !event["type"].is_string()) {
    why = fmt::format("an event without a type: {}", line.substr(0, 200));
    return WatchEnd::broken;
  }
  type = event["type"].get<std::string>();
  const nlohmann::json& object = event.contains("object") ? event["object"] : event;
  if (type == "ERROR") {  // 410 Gone: the version is too old to watch from
    if (object.is_object() && object.contains("code") && object["code"] == 410) {
      return WatchEnd::expired;
    }
    why = fmt::format("the API server sent {}", line.substr(0, 200));
    return WatchEnd::broken;
  }
  if (!object.is_object()) {
    why = fmt::format("a {} event without an object", type.substr(0, 40));
    return WatchEnd::broken;
  }
  if (type != "ADDED" && type != "MODIFIED" && type != "DELETED" && type != "BOOKMARK") {
    why = fmt::format("an event of unknown type {}", type.substr(0, 40));
    return WatchEnd::broken;
  }
  if (const std::string seen = version_of(object); !seen.empty()) version = seen;
  if (type == "BOOKMARK") return WatchEnd::not_yet;
  try {
    handlers.apply(type, object);
  } catch (const std::exception& error) {  // list again rather than guess
    why = error.what();
    return WatchEnd::broken;
  }
  return WatchEnd::not_yet;
}

void follow_collection(const Cluster& cluster, const Collection& collection,
                       const CollectionHandlers& handlers, const std::atomic<bool>& stop,
                       const base::Reporter& report) {
  auto tell = [&report](const std::string& text) { base::tell(report, text); };
  // A watch that ends at once without news (a server answering 410, or closing, every time)
  // is retried ever more slowly: 100 ms, doubling up to 5 s.
  constexpr std::chrono::milliseconds kFirstBackoff{100}, kMostBackoff{5000};
  std::chrono::milliseconds backoff{0};
  auto fruitless = [&] {
    backoff = std::min(kMostBackoff, backoff.count() == 0 ? kFirstBackoff : 2 * backoff);
    pause_for(backoff, stop);
  };
  while (!stop) {
    try {
      std::string version, error;
      if (const base::Status listed = list_collection(cluster, collection, handlers, version);
          !listed.ok()) {
        tell(listed.message());
        pause_for(std::chrono::seconds(1), stop);
        continue;
      }
      WatchEnd end = WatchEnd::not_yet;
      while (!stop && end == WatchEnd::not_yet) {
        const auto started = Clock::now();
        int applied = 0;
        const ApiResponse answer = cluster.watch(
            collection, version,
            [&](const std::string& line) {
              end = apply_watch_line(line, handlers, version, error);
              applied += end == WatchEnd::not_yet;
              return end == WatchEnd::not_yet;
            },
            stop, 330);
        if (end == WatchEnd::not_yet && answer.status != 200 && !stop) {
          error = fmt::format("HTTP {} {}", answer.status, answer.error);
          end = WatchEnd::broken;
        }
        if (end == WatchEnd::broken) {  // whatever broke it, say so, and do not hammer the server
          tell(fmt::format("watching {}: {}; listing again", collection.describe(), error));
          pause_for(std::chrono::seconds(1), stop);
        } else if (applied == 0 && Clock::now() - started < std::chrono::seconds(1)) {
          fruitless();
        } else {
          backoff = std::chrono::milliseconds(0);
        }
        // A stream that ends cleanly (timeoutSeconds) is resumed from the last version seen.
      }
    } catch (const std::exception& failure) {  // nothing may end the thread
      tell(fmt::format("watching {}: {}", collection.describe(), failure.what()));
      pause_for(std::chrono::seconds(1), stop);
    }
  }
}

}  // namespace tessera::kube
