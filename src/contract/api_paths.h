// The Kubernetes API paths Tessera calls, built in one place. Names come from objects the API
// server gave or from flags, and are escaped here all the same: a name with '/' or '?' must not
// turn into another path.
#pragma once

#include <string>

namespace tessera::contract::api {

std::string nodes();                                // every node (list, watch)
std::string node(const std::string& name);          // one node (get, patch)
std::string node_named(const std::string& name);    // a list of just that node (watch)
std::string pods();                                 // every pod (list, watch)
std::string pods_on_node(const std::string& node);  // the pods bound to a node
std::string pod(const std::string& name_space, const std::string& name);
std::string pod_binding(const std::string& name_space, const std::string& name);
std::string leases(const std::string& name_space);
std::string lease(const std::string& name_space, const std::string& name);

}  // namespace tessera::contract::api
