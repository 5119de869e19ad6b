// Keeps a collection of Kubernetes objects current, as client-go's reflectors do: lists it,
// then watches from the list's resourceVersion and hands each change to the collection's
// owner; lists again when the watch breaks or its version has expired (410 Gone), backing
// off while that repeats. Everything the API server sends is read with bounds and checked.
#pragma once

#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/log.h"
#include "base/status.h"
#include "kube/cluster.h"

namespace tessera::kube {

// What the owner of a collection does with what the API server says of it.
struct CollectionHandlers {
  // A list's items (an array): replaces everything known. An item that cannot be read is the
  // owner's to report and skip; an exception (its message the reason) refuses the whole list.
  std::function<void(const nlohmann::json& items)> replace;
  // One ADDED, MODIFIED or DELETED event's object. An exception (its message the reason)
  // ends the watch, and the collection is listed again rather than guessed at.
  std::function<void(std::string_view type, const nlohmann::json& object)> apply;
};

// Lists `collection` into `handlers`; the list's version in `version`. A failure if it cannot
// be read.
base::Status list_collection(const Cluster& cluster, const Collection& collection,
                             const CollectionHandlers& handlers, std::string& version);

enum class WatchEnd { not_yet, expired, broken };
// Applies one line of a watch (one event); says whether the watch must end, and if it broke,
// why. `version` follows the events' resourceVersion.
WatchEnd apply_watch_line(const std::string& line, const CollectionHandlers& handlers,
                          std::string& version, std::string& why);

// Lists and watches `collection` until `stop`; failures go to `report`. Never throws.
void follow_collection(const Cluster& cluster, const Collection& collection,
                       const CollectionHandlers& handlers, const std::atomic<bool>& stop,
                       const base::Reporter& report);

}  // namespace tessera::kube
