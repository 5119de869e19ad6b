// deploy/ as kubectl would apply it.
#include "node_fixtures.h"

namespace tessera::test {
namespace {

// deploy/ as kubectl would apply it: every document parses, the DaemonSet mounts only
// volumes it declares and runs as the account the RBAC binds, and each config in its
// ConfigMap is one the agent serves.
TEST(NodeDeploy, TheManifestsHoldTogetherAndTheConfigMapHoldsConfigsTheAgentServes) {
  const std::string deploy = std::string(TESSERA_SOURCE_DIR) + "/deploy/";
  for (const auto& entry : fs::directory_iterator(deploy)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    for (const YAML::Node& document : YAML::LoadAllFromFile(entry.path().string())) {
      if (document.IsNull()) continue;  // comments after the last ---
      EXPECT_TRUE(document["apiVersion"] && document["kind"])
          << "a document without apiVersion and kind";
    }
  }
  std::map<std::string, YAML::Node> objects;  // by kind
  for (const YAML::Node& document : YAML::LoadAllFromFile(deploy + "tessera-node.yaml")) {
    objects[document["kind"].as<std::string>()] = document;
  }
  const YAML::Node config_map = objects.at("ConfigMap");
  const YAML::Node daemon_set = objects.at("DaemonSet");
  std::set<std::string> configs;
  for (const auto& item : config_map["data"]) {
    const std::string name = item.first.as<std::string>();
    SCOPED_TRACE(name);
    configs.insert(name);
    const PluginConfig config = parse_plugin_config(item.second.as<std::string>(), name, name);
    EXPECT_NO_THROW(build_resource_map(machine(2), config));
  }
  const YAML::Node pod = daemon_set["spec"]["template"]["spec"];
  EXPECT_EQ(pod["serviceAccountName"].as<std::string>(),
            objects.at("ServiceAccount")["metadata"]["name"].as<std::string>());
  EXPECT_EQ(objects.at("ClusterRoleBinding")["subjects"][0]["name"].as<std::string>(),
            pod["serviceAccountName"].as<std::string>());
  std::set<std::string> volumes;
  for (const auto& volume : pod["volumes"]) {
    volumes.insert(volume["name"].as<std::string>());
    if (volume["configMap"]) {
      EXPECT_EQ(volume["configMap"]["name"].as<std::string>(),
                config_map["metadata"]["name"].as<std::string>());
    }
  }
  const YAML::Node container = pod["containers"][0];
  for (const auto& mount : container["volumeMounts"]) {
    EXPECT_EQ(volumes.count(mount["name"].as<std::string>()), 1u)
        << mount["name"].as<std::string>();
  }
  bool named_config = false;
  for (const auto& word : container["command"]) {
    const std::string argument = word.as<std::string>();
    if (argument.rfind("--config=", 0) == 0) {
      named_config = true;
      EXPECT_EQ(configs.count(argument.substr(9)), 1u)
          << argument << " names no key of the ConfigMap";
    }
  }
  EXPECT_TRUE(named_config);
  // The RBAC lets the agent do what it does: patch its node, read and claim its pods.
  std::set<std::string> granted;
  for (const auto& rule : objects.at("ClusterRole")["rules"]) {
    for (const auto& resource : rule["resources"]) {
      for (const auto& verb : rule["verbs"])
        granted.insert(resource.as<std::string>() + ":" + verb.as<std::string>());
    }
  }
  for (const char* needed :
       {"nodes:get", "nodes:list", "nodes:watch", "nodes:patch", "pods:list", "pods:patch"}) {
    EXPECT_EQ(granted.count(needed), 1u) << needed;
  }
}

}  // namespace
}  // namespace tessera::test
