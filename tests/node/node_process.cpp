#include "node_process.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "contract/pod_resources.h"

namespace tessera::test {

namespace fs = std::filesystem;

std::string example(const std::string& name) {
  return std::string(TESSERA_SOURCE_DIR) + "/examples/node-configs/" + name;
}

void write_config(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  std::ofstream(temporary) << text;
  fs::rename(temporary, path);
}

Environment machine(const ScratchDirectory& scratch, const std::string& devices,
                    const Environment& extra) {
  Environment env = unhooked(scratch, {{"TESSERA_SIM_DEVICES", devices}});
  for (const auto& [key, value] : extra) env[key] = value;
  return env;
}

NodeProcess::NodeProcess(const ScratchDirectory& scratch, const std::vector<std::string>& extra,
                         const Environment& environment, const std::string& name)
    : log_(scratch.file("node.log")) {
  std::vector<std::string> argv = {"/bin/sh",
                                   "-c",
                                   "exec \"$0\" \"$@\" 2>>\"$TESSERA_TEST_LOG\"",
                                   tessera(),
                                   "node",
                                   "--node-name",
                                   name,
                                   "--device-plugin-dir",
                                   scratch.file("dp"),
                                   "--pod-resources-socket",
                                   scratch.file("pod-resources/kubelet.sock"),
                                   "--state-dir",
                                   scratch.file("state"),
                                   "--metrics-listen",
                                   "127.0.0.1:0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Environment env = environment;
  env["TESSERA_TEST_LOG"] = log_;
  process_ = std::make_unique<Running>(argv, env);
  started_ = process_->read_line() == "tessera node: serving";
  std::smatch port;
  const std::string text = log();
  if (std::regex_search(text, port, std::regex("metrics on http://127.0.0.1:([0-9]+)/metrics"))) {
    metrics_port_ = std::stoi(port[1]);
  }
}

NodeProcess::~NodeProcess() {
  if (!stopped_) {
    EXPECT_EQ(stop(), 0) << log();
  }
}

std::string NodeProcess::log() const {
  return read_text_file(log_);
}

int NodeProcess::stop() {
  if (stopped_) return status_;
  stopped_ = true;
  kill(process_->pid(), SIGTERM);
  status_ = process_->wait_for(std::chrono::seconds(20));
  if (status_ < 0) {
    ADD_FAILURE() << "tessera node did not stop within 20 s of SIGTERM\n" << log();
    process_->kill_hard();
    status_ = process_->wait();
  }
  return status_;
}

void NodeProcess::kill_hard() {
  stopped_ = true;
  process_->kill_hard();
  status_ = process_->wait();
}

std::string NodeProcess::metrics() const {
  httplib::Client client("127.0.0.1", metrics_port_);
  const auto answer = client.Get("/metrics");
  return answer && answer->status == 200 ? answer->body : std::string();
}

double NodeProcess::metric(const std::string& sample) const {
  const std::string text = metrics();
  const std::size_t at = text.find("\n" + sample + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + sample.size() + 2));
}

SchedulerProcess::SchedulerProcess(const FakeCluster& cluster, const Environment& environment) {
  process_ = std::make_unique<Running>(
      std::vector<std::string>{tessera(), "scheduler", "--listen", "127.0.0.1:0", "--api-server",
                               cluster.url()},
      environment);
  std::smatch listening;
  const std::string line = process_->read_line();
  if (std::regex_search(line, listening, std::regex(":([0-9]+)$"))) port_ = std::stoi(listening[1]);
  EXPECT_NE(port_, 0) << line;
}

std::string SchedulerProcess::schedule(const nlohmann::json& pod,
                                       const std::vector<std::string>& nodes, std::string& why) {
  httplib::Client extender("127.0.0.1", port_);
  const nlohmann::json args{{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", nodes}};
  const auto filtered = extender.Post("/filter", args.dump(), "application/json");
  if (!filtered || filtered->status != 200) {
    why = filtered ? filtered->body : "no answer to filter";
    return {};
  }
  const nlohmann::json passed = nlohmann::json::parse(filtered->body)["NodeNames"];
  if (!passed.is_array() || passed.empty()) {
    why = filtered->body;
    return {};
  }
  const nlohmann::json scoring{{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", passed}};
  const auto scored = extender.Post("/prioritize", scoring.dump(), "application/json");
  std::string best = passed[0];
  if (scored && scored->status == 200) {
    long top = -1;
    for (const auto& entry : nlohmann::json::parse(scored->body)) {
      if (entry["Score"].get<long>() > top) {
        top = entry["Score"].get<long>();
        best = entry["Host"].get<std::string>();
      }
    }
  }
  const nlohmann::json bind{{"PodName", pod["metadata"]["name"]},
                            {"PodNamespace", pod["metadata"].value("namespace", "default")},
                            {"PodUID", pod["metadata"]["uid"]},
                            {"Node", best}};
  const auto bound = extender.Post("/bind", bind.dump(), "application/json");
  if (!bound || bound->status != 200 || nlohmann::json::parse(bound->body)["Error"] != "") {
    why = bound ? bound->body : "no answer to bind";
    return {};
  }
  return best;
}

std::set<std::string> ids_of(const TestKubelet::Devices& devices) {
  std::set<std::string> ids;
  for (const auto& [id, state] : devices) ids.insert(id);
  return ids;
}

std::function<bool(const TestKubelet::Devices&)> has_ids(const std::set<std::string>& wanted) {
  return [wanted](const TestKubelet::Devices& devices) { return ids_of(devices) == wanted; };
}

TestKubelet::PodSpec kubelet_pod(const nlohmann::json& pod) {
  TestKubelet::PodSpec spec;
  spec.name_space = pod["metadata"].value("namespace", "default");
  spec.name = pod["metadata"]["name"];
  for (const auto& container : pod["spec"]["containers"]) {
    TestKubelet::PodSpec::Container entry{container["name"], {}};
    const nlohmann::json limits =
        container.contains("resources")
            ? container["resources"].value("limits", nlohmann::json::object())
            : nlohmann::json::object();
    for (const auto& [resource, value] : limits.items()) {
      // Device plugins' resources: all but the node's own and those no node advertises.
      bool plugins = resource != "cpu" && resource != "memory" && resource != "ephemeral-storage" &&
                     !resource.starts_with("hugepages-");
      for (const contract::PodResourceName& known : contract::kPodResources) {
        plugins = plugins && (known.advertised || resource != known.name);
      }
      if (!plugins) continue;
      entry.devices[resource] =
          value.is_string() ? std::stoi(value.get<std::string>()) : value.get<int>();
    }
    spec.containers.push_back(std::move(entry));
  }
  return spec;
}

ContainerSpec container_spec(const TestKubelet::AdmittedContainer& container) {
  ContainerSpec spec;
  for (const v1beta1::ContainerAllocateResponse& answer : container.answers) {
    for (const auto& [name, value] : answer.envs()) spec.envs[name] = value;
    for (const auto& mount : answer.mounts()) {
      spec.mounts.push_back({mount.container_path(), mount.host_path(), mount.read_only()});
    }
  }
  return spec;
}

}  // namespace tessera::test
