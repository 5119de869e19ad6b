// tessera scheduler as a service: several replicas with one leader (a coordination.k8s.io
// Lease on the fake API server), HTTPS with a certificate from files, and the Deployment's
// manifests in deploy/.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "contract/annotations.h"
#include "contract/dra.h"
#include "contract/host_layout.h"
#include "contract/pod_resources.h"
#include "fake_cluster.h"
#include "kube/api_client.h"
#include "kube/lease.h"
#include "mig/catalog.h"
#include "support.h"

namespace tessera::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kLeaseKey = "kube-system/tessera-scheduler";

// A node whose GPUs Tessera places on, annotated as by hand (every GPU alike, sliceable).
nlohmann::json gpu_node(const std::string& name, int gpus) {
  nlohmann::json node = cluster_node(name);
  node["metadata"]["annotations"][contract::kGpusAnnotation] = nlohmann::json{
      {"model", "NVIDIA-A100-SXM4-40GB"},
      {"count", gpus},
      {"memory_mib", 40960}}.dump();
  return node;
}

// One replica of `tessera scheduler`, its port read from its first line.
class Replica {
 public:
  Replica(const std::vector<std::string>& arguments, const Environment& env = {}) {
    std::vector<std::string> argv = {tessera(), "scheduler", "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    process_ = std::make_unique<Running>(argv, env);
    const std::string line = process_->read_line();
    std::smatch port;
    if (std::regex_search(line, port, std::regex(":([0-9]+)$"))) port_ = std::stoi(port[1]);
  }
  int port() const { return port_; }
  Running& process() { return *process_; }
  httplib::Client client() const { return httplib::Client("127.0.0.1", port_); }
  // The value of a metric line without labels, or -1.
  double metric(const std::string& name) const {
    auto answer = client().Get("/metrics");
    if (!answer || answer->status != 200) return -1;
    std::smatch value;
    if (!std::regex_search(answer->body, value, std::regex("\n" + name + " ([0-9.e+-]+)\n"))) {
      return -1;
    }
    return std::stod(value[1]);
  }
  // Waits until this replica says it binds (leads, its state read), or `timeout` passes.
  bool wait_until_leading(std::chrono::milliseconds timeout) const {
    const auto until = Clock::now() + timeout;
    while (Clock::now() < until) {
      if (metric("tessera_extender_leader") == 1) return true;
      std::this_thread::sleep_for(20ms);  // polling a process: no event to wait on
    }
    return false;
  }
  // Binds `pod` (its name and UID from the cluster) to `node`; the answer's Error.
  std::string bind(const nlohmann::json& pod, const std::string& node) const {
    const nlohmann::json args{{"PodName", pod["metadata"]["name"]},
                              {"PodNamespace", pod["metadata"]["namespace"]},
                              {"PodUID", pod["metadata"]["uid"]},
                              {"Node", node}};
    auto answer = client().Post("/bind", args.dump(), "application/json");
    if (!answer) return "no answer";
    return nlohmann::json::parse(answer->body).value("Error", std::string("no Error field"));
  }

 private:
  std::unique_ptr<Running> process_;
  int port_ = -1;
};

std::vector<std::string> elect_as(const std::string& identity, const FakeCluster& cluster) {
  return {"--api-server",
          cluster.url(),
          "--leader-elect",
          "--leader-identity",
          identity,
          "--lease-duration",
          "3",
          "--renew-deadline",
          "2",
          "--retry-period",
          "0.2"};
}

// The GPUs the extender recorded on a bound pod.
std::string assignment(FakeCluster& cluster, const std::string& pod) {
  const auto object = cluster.get("pods", "default/" + pod);
  if (!object) return "";
  return (*object)["metadata"]["annotations"].value(contract::kAssignmentAnnotation, std::string());
}

std::int64_t micro_time_us(const std::string& text) {
  std::tm parts{};
  int micros = 0;
  if (std::sscanf(text.c_str(), "%d-%d-%dT%d:%d:%d.%dZ", &parts.tm_year, &parts.tm_mon,
                  &parts.tm_mday, &parts.tm_hour, &parts.tm_min, &parts.tm_sec, &micros) != 7) {
    ADD_FAILURE() << "not a MicroTime: " << text;
    return 0;
  }
  parts.tm_year -= 1900;
  parts.tm_mon -= 1;
  return static_cast<std::int64_t>(timegm(&parts)) * 1000000 + micros;
}

TEST(SchedulerReplicas, OneLeadsTheOtherTakesOverWhenItIsKilledAndNoGpuIsGivenTwice) {
  FakeCluster cluster;
  cluster.put("nodes", gpu_node("gpu-a", 2));
  Replica first(elect_as("replica-a", cluster));
  Replica second(elect_as("replica-b", cluster));
  ASSERT_GT(first.port(), 0);
  ASSERT_GT(second.port(), 0);

  // One of them takes the Lease and, its state read, binds.
  ASSERT_TRUE(cluster.wait_for(
      "leases", kLeaseKey,
      [](const nlohmann::json& lease) { return !lease["spec"]["holderIdentity"].empty(); }, 20s));
  const std::string holder =
      (*cluster.get("leases", kLeaseKey))["spec"]["holderIdentity"].get<std::string>();
  ASSERT_TRUE(holder == "replica-a" || holder == "replica-b") << holder;
  Replica& leader = holder == "replica-a" ? first : second;
  Replica& follower = holder == "replica-a" ? second : first;
  const std::string follower_identity = holder == "replica-a" ? "replica-b" : "replica-a";
  ASSERT_TRUE(leader.wait_until_leading(20s));
  EXPECT_EQ(follower.metric("tessera_extender_leader"), 0);

  // The follower refuses to bind; the leader binds.
  cluster.put("pods", gpu_pod("first", 1));
  const nlohmann::json first_pod = *cluster.get("pods", "default/first");
  EXPECT_NE(follower.bind(first_pod, "gpu-a").find("not the leader"), std::string::npos);
  EXPECT_FALSE((*cluster.get("pods", "default/first"))["spec"].contains("nodeName"));
  ASSERT_EQ(leader.bind(first_pod, "gpu-a"), "");
  const std::string first_gpus = assignment(cluster, "first");
  ASSERT_FALSE(first_gpus.empty());

  // The leader dies at once, without giving the Lease up.
  const nlohmann::json last_renewal = *cluster.get("leases", kLeaseKey);
  leader.process().kill_hard();
  const auto killed = Clock::now();
  ASSERT_TRUE(cluster.wait_for(
      "leases", kLeaseKey,
      [&](const nlohmann::json& lease) {
        return lease["spec"]["holderIdentity"] == follower_identity;
      },
      30s));
  const auto took_over = Clock::now();
  const nlohmann::json taken = *cluster.get("leases", kLeaseKey);
  EXPECT_EQ(taken["spec"]["leaseTransitions"],
            last_renewal["spec"]["leaseTransitions"].get<int>() + 1);
  // Not before the dead leader's last renewal had expired (its lease duration, 3 s; it may
  // have renewed once more, a retry period later, between the read above and the kill)...
  EXPECT_GE(micro_time_us(taken["spec"]["acquireTime"]) -
                micro_time_us(last_renewal["spec"]["renewTime"]),
            3'000'000);
  // ... and within the lease time after the kill, give or take a retry period and a busy host.
  EXPECT_LT(took_over - killed, 3s + 200ms + 2s);
  ASSERT_TRUE(follower.wait_until_leading(20s));

  // The new leader knows what the old one gave: the other GPU for the next pod, none for a
  // third.
  cluster.put("pods", gpu_pod("second", 1));
  cluster.put("pods", gpu_pod("third", 1));
  ASSERT_EQ(follower.bind(*cluster.get("pods", "default/second"), "gpu-a"), "");
  const std::string second_gpus = assignment(cluster, "second");
  ASSERT_FALSE(second_gpus.empty());
  EXPECT_NE(nlohmann::json::parse(first_gpus)["gpus"], nlohmann::json::parse(second_gpus)["gpus"])
      << first_gpus << " / " << second_gpus;
  EXPECT_NE(follower.bind(*cluster.get("pods", "default/third"), "gpu-a").find("no longer fits"),
            std::string::npos);
  EXPECT_FALSE((*cluster.get("pods", "default/third"))["spec"].contains("nodeName"));
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

// A self-signed certificate for 127.0.0.1, as an operator would make one with openssl.
void make_certificate(const ScratchDirectory& scratch) {
  const Finished made =
      run({"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
           "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", scratch.file("tls.key"), "-out",
           scratch.file("tls.crt"), "-days", "2", "-subj", "/CN=tessera-scheduler", "-addext",
           "subjectAltName=IP:127.0.0.1,DNS:localhost"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
}

TEST(SchedulerHttps, ServesWithACertificateFromFilesThatClientsVerify) {
  ScratchDirectory scratch;
  make_certificate(scratch);
  FakeCluster cluster;
  cluster.put("nodes", gpu_node("gpu-a", 1));
  Replica secure({"--api-server", cluster.url(), "--tls-cert-file", scratch.file("tls.crt"),
                  "--tls-key-file", scratch.file("tls.key")});
  ASSERT_GT(secure.port(), 0);

  // A client that trusts the certificate gets answers, as kube-scheduler with tlsConfig.caFile.
  httplib::SSLClient trusting("127.0.0.1", secure.port());
  trusting.set_ca_cert_path(scratch.file("tls.crt").c_str());
  trusting.enable_server_certificate_verification(true);
  const auto health = trusting.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  cluster.put("pods", gpu_pod("web", 1));
  const nlohmann::json args{{"Pod", *cluster.get("pods", "default/web")}, {"NodeNames", {"gpu-a"}}};
  const auto filtered = trusting.Post("/filter", args.dump(), "application/json");
  ASSERT_TRUE(filtered);
  EXPECT_EQ(nlohmann::json::parse(filtered->body)["NodeNames"], nlohmann::json({"gpu-a"}));

  // One that does not trust it, and plain HTTP, get nothing.
  httplib::SSLClient doubting("127.0.0.1", secure.port());
  doubting.set_ca_cert_path(scratch.file("no-such-ca.crt").c_str());
  doubting.enable_server_certificate_verification(true);
  EXPECT_FALSE(doubting.Get("/healthz"));
  httplib::Client plain("127.0.0.1", secure.port());
  plain.set_read_timeout(5, 0);
  const auto unencrypted = plain.Get("/healthz");
  EXPECT_TRUE(!unencrypted || unencrypted->status != 200);
  // The server carries on after both.
  EXPECT_TRUE(trusting.Get("/healthz"));
}

// Whether a fresh connection that trusts only `ca_file` gets /healthz from the replica.
bool trusted_by(int port, const std::string& ca_file) {
  httplib::SSLClient client("127.0.0.1", port);
  client.set_ca_cert_path(ca_file.c_str());
  client.enable_server_certificate_verification(true);
  const auto health = client.Get("/healthz");
  return health && health->status == 200;
}

// Moves `from` over `to` in one step, as a Secret volume's update or cert-manager does.
void replace_file(const std::string& from, const std::string& to) {
  std::filesystem::rename(from, to);
}

TEST(SchedulerHttps, ARenewedCertificateServesFromTheNextConnectionAndABrokenOneDoesNot) {
  ScratchDirectory scratch, renewed;
  make_certificate(scratch);
  make_certificate(renewed);
  std::filesystem::copy_file(scratch.file("tls.crt"), scratch.file("first-ca.crt"));
  FakeCluster cluster;
  // stderr to a file, to read what the replica says of the renewals.
  Running replica({"/bin/sh", "-c",
                   "exec \"$0\" scheduler --listen 127.0.0.1:0 --api-server \"$1\" "
                   "--tls-cert-file \"$2\" --tls-key-file \"$3\" 2>\"$4\"",
                   tessera(), cluster.url(), scratch.file("tls.crt"), scratch.file("tls.key"),
                   scratch.file("stderr")},
                  Environment{});
  std::smatch found;
  const std::string line = replica.read_line();
  ASSERT_TRUE(std::regex_search(line, found, std::regex(":([0-9]+)$"))) << line;
  const int port = std::stoi(found[1]);
  EXPECT_TRUE(trusted_by(port, scratch.file("first-ca.crt")));
  EXPECT_FALSE(trusted_by(port, renewed.file("tls.crt")));

  // Renewed in place, key first: the next connection gets the new certificate.
  replace_file(renewed.file("tls.key"), scratch.file("tls.key"));
  std::filesystem::copy_file(renewed.file("tls.crt"), renewed.file("copy.crt"));
  replace_file(renewed.file("copy.crt"), scratch.file("tls.crt"));
  EXPECT_TRUE(trusted_by(port, renewed.file("tls.crt")));
  EXPECT_FALSE(trusted_by(port, scratch.file("first-ca.crt")));

  // A certificate file that cannot serve (cut short, then of another key) is said and passed
  // over: the last good pair serves on.
  std::ofstream(scratch.file("cut.crt")) << "-----BEGIN CERTIFICATE-----\nMIIB\n";
  replace_file(scratch.file("cut.crt"), scratch.file("tls.crt"));
  EXPECT_TRUE(trusted_by(port, renewed.file("tls.crt")));
  std::filesystem::copy_file(scratch.file("first-ca.crt"), scratch.file("other.crt"));
  replace_file(scratch.file("other.crt"), scratch.file("tls.crt"));
  EXPECT_TRUE(trusted_by(port, renewed.file("tls.crt")));
  EXPECT_TRUE(trusted_by(port, renewed.file("tls.crt")));  // and says it once
  kill(replica.pid(), SIGTERM);
  EXPECT_EQ(replica.wait(), 0);
  const std::string said = read_text_file(scratch.file("stderr"));
  EXPECT_NE(said.find("serving the certificate in " + scratch.file("tls.crt") + " as it is now"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find(scratch.file("tls.crt") + " holds no PEM certificate"), std::string::npos)
      << said;
  const std::string mismatch =
      "the key in " + scratch.file("tls.key") + " is not the certificate's";
  ASSERT_NE(said.find(mismatch), std::string::npos) << said;
  EXPECT_EQ(said.find(mismatch, said.find(mismatch) + 1), std::string::npos) << said;
}

TEST(SchedulerHttps, CertificatesThatCannotServeAreRefusedByName) {
  ScratchDirectory scratch;
  make_certificate(scratch);
  std::ofstream(scratch.file("garbage.key")) << "-----BEGIN PRIVATE KEY-----\nnot a key\n";
  FakeCluster cluster;
  const auto start = [&](const std::vector<std::string>& tls) {
    std::vector<std::string> argv = {tessera(),     "scheduler",    "--listen",
                                     "127.0.0.1:0", "--api-server", cluster.url()};
    argv.insert(argv.end(), tls.begin(), tls.end());
    return run(argv);
  };
  const Finished alone = start({"--tls-cert-file", scratch.file("tls.crt")});
  EXPECT_EQ(alone.exit_code, 2) << alone.err;
  EXPECT_NE(alone.err.find("--tls-cert-file and --tls-key-file go together"), std::string::npos)
      << alone.err;
  const Finished missing =
      start({"--tls-cert-file", scratch.file("tls.crt"), "--tls-key-file", scratch.file("none")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find(scratch.file("none")), std::string::npos) << missing.err;
  const Finished garbage = start(
      {"--tls-cert-file", scratch.file("tls.crt"), "--tls-key-file", scratch.file("garbage.key")});
  EXPECT_EQ(garbage.exit_code, 1);
  EXPECT_NE(garbage.err.find(scratch.file("garbage.key")), std::string::npos) << garbage.err;
  // The key of another certificate does not match this one.
  ScratchDirectory other;
  make_certificate(other);
  const Finished mismatched =
      start({"--tls-cert-file", scratch.file("tls.crt"), "--tls-key-file", other.file("tls.key")});
  EXPECT_EQ(mismatched.exit_code, 1) << mismatched.err;
}

TEST(SchedulerReplicas, LeaderElectionSettingsThatCouldElectTwoAreRefused) {
  FakeCluster cluster;
  const auto start = [&](const std::vector<std::string>& more) {
    std::vector<std::string> argv = {tessera(),      "scheduler",   "--listen",      "127.0.0.1:0",
                                     "--api-server", cluster.url(), "--leader-elect"};
    argv.insert(argv.end(), more.begin(), more.end());
    return run(argv);
  };
  const Finished slow_renewal = start({"--lease-duration", "5", "--renew-deadline", "6"});
  EXPECT_EQ(slow_renewal.exit_code, 2);
  EXPECT_NE(slow_renewal.err.find("renew deadline 6000 ms < lease duration 5 s"), std::string::npos)
      << slow_renewal.err;
  const Finished bad_name = start({"--lease-name", "Not_A_Name"});
  EXPECT_EQ(bad_name.exit_code, 2);
  EXPECT_NE(bad_name.err.find("lease name 'Not_A_Name'"), std::string::npos) << bad_name.err;
}

}  // namespace
}  // namespace tessera::test

// The manifests in deploy/, checked offline: each document is an object Kubernetes knows with
// the fields its kind has (a misspelt field fails here, not on a user's cluster), names that
// refer to each other agree, and the scheduler's configuration agrees with the Deployment that
// carries it.
namespace tessera::test {
namespace {

using Fields = std::set<std::string>;

const std::map<std::string, std::pair<std::string, Fields>>& kinds() {
  static const std::map<std::string, std::pair<std::string, Fields>> known = {
      {"ServiceAccount", {"v1", {}}},
      {"ConfigMap", {"v1", {"data"}}},
      {"Service", {"v1", {"spec"}}},
      {"Pod", {"v1", {"spec"}}},
      {"Deployment", {"apps/v1", {"spec"}}},
      {"DaemonSet", {"apps/v1", {"spec"}}},
      {"ClusterRole", {"rbac.authorization.k8s.io/v1", {"rules"}}},
      {"ClusterRoleBinding", {"rbac.authorization.k8s.io/v1", {"roleRef", "subjects"}}},
      {"RoleBinding", {"rbac.authorization.k8s.io/v1", {"roleRef", "subjects"}}},
      {"DeviceClass", {"resource.k8s.io/v1", {"spec"}}},
      {"ResourceClaimTemplate", {"resource.k8s.io/v1", {"spec"}}},
      {"KubeSchedulerConfiguration",
       {"kubescheduler.config.k8s.io/v1", {"leaderElection", "profiles", "extenders"}}},
  };
  return known;
}

const Fields kPodSpecFields = {
    "containers",    "initContainers", "volumes",         "serviceAccountName", "nodeSelector",
    "tolerations",   "affinity",       "hostPID",         "hostNetwork",        "priorityClassName",
    "schedulerName", "restartPolicy",  "securityContext", "runtimeClassName",   "resourceClaims"};
const Fields kContainerFields = {"name",
                                 "image",
                                 "command",
                                 "args",
                                 "workingDir",
                                 "ports",
                                 "env",
                                 "envFrom",
                                 "resources",
                                 "volumeMounts",
                                 "livenessProbe",
                                 "readinessProbe",
                                 "startupProbe",
                                 "lifecycle",
                                 "imagePullPolicy",
                                 "securityContext"};
const Fields kExtenderFields = {"urlPrefix",        "filterVerb",       "preemptVerb",
                                "prioritizeVerb",   "bindVerb",         "weight",
                                "enableHTTPS",      "tlsConfig",        "httpTimeout",
                                "nodeCacheCapable", "managedResources", "ignorable"};

void expect_only(const YAML::Node& map, const Fields& allowed, const std::string& where) {
  ASSERT_TRUE(map.IsMap()) << where << " is not a map";
  for (const auto& entry : map) {
    EXPECT_TRUE(allowed.count(entry.first.as<std::string>()) > 0)
        << where << ": unknown field '" << entry.first.as<std::string>() << "'";
  }
}

struct Manifests {
  std::vector<std::pair<std::string, YAML::Node>> documents;  // file, document
  std::vector<YAML::Node> of(const std::string& kind) const {
    std::vector<YAML::Node> found;
    for (const auto& [file, document] : documents) {
      if (document["kind"].as<std::string>() == kind) found.push_back(document);
    }
    return found;
  }
  bool has(const std::string& kind, const std::string& name) const {
    for (const YAML::Node& document : of(kind)) {
      if (document["metadata"]["name"].as<std::string>() == name) return true;
    }
    return false;
  }
};

Manifests read_manifests() {
  Manifests manifests;
  const std::filesystem::path deploy = std::string(TESSERA_SOURCE_DIR) + "/deploy";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(deploy)) {
    if (entry.path().extension() != ".yaml") continue;
    for (const YAML::Node& document : YAML::LoadAllFromFile(entry.path().string())) {
      if (!document.IsNull()) {
        manifests.documents.emplace_back(entry.path().lexically_relative(deploy), document);
      }
    }
  }
  return manifests;
}

// Checks a pod template's spec: known fields, volumes and the service account it names exist.
void check_pod_spec(const YAML::Node& spec, const Manifests& manifests, const std::string& where) {
  expect_only(spec, kPodSpecFields, where);
  std::set<std::string> volumes;
  for (const YAML::Node& volume : spec["volumes"]) {
    volumes.insert(volume["name"].as<std::string>());
    if (volume["configMap"]) {
      EXPECT_TRUE(manifests.has("ConfigMap", volume["configMap"]["name"].as<std::string>()))
          << where << ": volume " << volume["name"] << " names a ConfigMap not in deploy/";
    }
  }
  if (spec["serviceAccountName"]) {
    EXPECT_TRUE(manifests.has("ServiceAccount", spec["serviceAccountName"].as<std::string>()))
        << where;
  }
  ASSERT_TRUE(spec["containers"].IsSequence()) << where;
  for (const YAML::Node& container : spec["containers"]) {
    const std::string at = where + " container " + container["name"].as<std::string>("?");
    expect_only(container, kContainerFields, at);
    EXPECT_FALSE(container["image"].as<std::string>("").empty()) << at;
    for (const YAML::Node& mount : container["volumeMounts"]) {
      EXPECT_TRUE(volumes.count(mount["name"].as<std::string>()) > 0)
          << at << " mounts a volume the pod lacks: " << mount["name"];
    }
    for (const YAML::Node& port : container["ports"]) {
      const int number = port["containerPort"].as<int>();
      EXPECT_TRUE(number > 0 && number < 65536) << at;
    }
  }
}

TEST(Manifests, EveryDocumentInDeployIsAKnownKindWithItsFieldsAndItsReferencesResolve) {
  const Manifests manifests = read_manifests();
  ASSERT_GE(manifests.documents.size(), 10u);
  for (const auto& [file, document] : manifests.documents) {
    const std::string kind = document["kind"].as<std::string>("");
    const auto known = kinds().find(kind);
    ASSERT_NE(known, kinds().end()) << file << ": kind '" << kind << "'";
    const std::string where = file + " " + kind;
    EXPECT_EQ(document["apiVersion"].as<std::string>(""), known->second.first) << where;
    Fields fields = known->second.second;
    fields.insert({"apiVersion", "kind", "metadata"});
    expect_only(document, fields, where);
    if (kind != "KubeSchedulerConfiguration") {
      EXPECT_FALSE(document["metadata"]["name"].as<std::string>("").empty()) << where;
    }
    if (kind == "Deployment" || kind == "DaemonSet") {
      const YAML::Node spec = document["spec"];
      for (const auto& label : spec["selector"]["matchLabels"]) {
        EXPECT_EQ(
            spec["template"]["metadata"]["labels"][label.first.as<std::string>()].as<std::string>(
                ""),
            label.second.as<std::string>())
            << where << ": the selector does not select its own pods";
      }
      check_pod_spec(spec["template"]["spec"], manifests, where);
    }
    if (kind == "Pod") check_pod_spec(document["spec"], manifests, where);
    if (kind.ends_with("Binding")) {
      for (const YAML::Node& subject : document["subjects"]) {
        EXPECT_TRUE(manifests.has("ServiceAccount", subject["name"].as<std::string>())) << where;
      }
      const std::string role = document["roleRef"]["name"].as<std::string>();
      EXPECT_TRUE(role.starts_with("system:") || role.starts_with("extension-apiserver") ||
                  manifests.has("ClusterRole", role))
          << where << ": role " << role;
    }
  }
}

// The value of `--flag=value` in a command, or "".
std::string flag(const YAML::Node& command, const std::string& name) {
  for (const YAML::Node& part : command) {
    const std::string text = part.as<std::string>();
    if (text.starts_with(name + "=")) return text.substr(name.size() + 1);
  }
  return "";
}

TEST(Manifests, TheSchedulerDeploymentRunsKubeSchedulerBesideTheExtenderAndTheyAgree) {
  const Manifests manifests = read_manifests();
  const std::string config_text =
      read_text_file(std::string(TESSERA_SOURCE_DIR) + "/deploy/scheduler-config.yaml");
  YAML::Node deployment, config_map;
  for (const YAML::Node& document : manifests.of("Deployment")) {
    if (document["metadata"]["name"].as<std::string>() == "tessera-scheduler")
      deployment = document;
  }
  for (const YAML::Node& document : manifests.of("ConfigMap")) {
    if (document["metadata"]["name"].as<std::string>() == "tessera-scheduler-config") {
      config_map = document;
    }
  }
  ASSERT_TRUE(deployment && config_map);
  EXPECT_EQ(config_map["data"]["scheduler-config.yaml"].as<std::string>(), config_text)
      << "deploy/scheduler-config.yaml and the ConfigMap's copy differ";
  EXPECT_GE(deployment["spec"]["replicas"].as<int>(), 2);

  YAML::Node scheduler, extender;
  for (const YAML::Node& container : deployment["spec"]["template"]["spec"]["containers"]) {
    if (container["image"].as<std::string>().starts_with("registry.k8s.io/kube-scheduler:")) {
      scheduler = container;
    }
    if (container["command"][0].as<std::string>("") == "tessera") extender = container;
  }
  ASSERT_TRUE(scheduler) << "no upstream kube-scheduler container";
  ASSERT_TRUE(extender) << "no tessera container";
  const YAML::Node config = YAML::Load(config_text);
  EXPECT_EQ(flag(scheduler["command"], "--config"), "/etc/tessera/scheduler-config.yaml");

  // kube-scheduler reaches its extender where the extender listens, as it serves.
  ASSERT_EQ(config["extenders"].size(), 1u);
  const YAML::Node consulted = config["extenders"][0];
  expect_only(consulted, kExtenderFields, "scheduler-config.yaml extender");
  const std::string url = consulted["urlPrefix"].as<std::string>();
  const std::string listen = flag(extender["command"], "--listen");
  ASSERT_FALSE(listen.empty());
  EXPECT_TRUE(url.ends_with(":" + listen.substr(listen.rfind(':') + 1))) << url << " / " << listen;
  const bool https = consulted["enableHTTPS"].as<bool>(false);
  EXPECT_EQ(url.starts_with("https://"), https) << url;
  EXPECT_EQ(!flag(extender["command"], "--tls-cert-file").empty(), https);
  EXPECT_EQ(consulted["filterVerb"].as<std::string>(), "filter");
  EXPECT_EQ(consulted["bindVerb"].as<std::string>(), "bind");
  EXPECT_EQ(consulted["preemptVerb"].as<std::string>(), "preempt");

  // The extender binds only while its kube-scheduler leads: it follows that Lease.
  EXPECT_TRUE(config["leaderElection"]["leaderElect"].as<bool>(false));
  bool follows = false;
  for (const YAML::Node& part : extender["command"])
    follows |= part.as<std::string>() == "--lease-follow";
  EXPECT_TRUE(follows);
  EXPECT_EQ(flag(extender["command"], "--lease-name"),
            config["leaderElection"]["resourceName"].as<std::string>());
  // Pods name the profile's scheduler.
  const std::string name = config["profiles"][0]["schedulerName"].as<std::string>();
  for (const YAML::Node& pod : manifests.of("Pod")) {
    EXPECT_EQ(pod["spec"]["schedulerName"].as<std::string>(""), name);
  }
}

// kube-scheduler consults the extender only for pods asking a managed resource, and leaves a pod
// Pending ("Insufficient ...") that asks a resource no node advertises unless told to ignore it.
// The list is derived from what the extender reads (contract/pod_resources.h) and every MIG
// profile's resource: a resource read there and left out here fails this test.
TEST(Manifests, TheExtenderManagesEveryResourceItReadsAndKubeSchedulerIgnoresTheUnadvertised) {
  const YAML::Node config =
      YAML::Load(read_text_file(std::string(TESSERA_SOURCE_DIR) + "/deploy/scheduler-config.yaml"));
  std::map<std::string, bool> managed;  // name -> ignoredByScheduler
  for (const YAML::Node& entry : config["extenders"][0]["managedResources"]) {
    managed[entry["name"].as<std::string>()] = entry["ignoredByScheduler"].as<bool>(false);
  }
  std::map<std::string, bool> wanted;
  for (const contract::PodResourceName& resource : contract::kPodResources) {
    wanted[resource.name] = !resource.advertised;
  }
  for (const mig::GpuModel& model : mig::builtin_catalog()) {
    for (const mig::Profile& profile : model.profiles) {
      wanted[std::string(contract::kMigResourcePrefix) + mig::resource_profile_name(profile.name)] =
          false;
    }
  }
  EXPECT_EQ(managed, wanted);
  // gpushare's pods name their scheduler: a profile of the same kube-scheduler answers to it.
  std::set<std::string> profiles;
  for (const YAML::Node& profile : config["profiles"]) {
    profiles.insert(profile["schedulerName"].as<std::string>());
  }
  EXPECT_EQ(profiles,
            (std::set<std::string>{contract::kSchedulerName, contract::kGpushareSchedulerName}));
}

// The node agent's DaemonSet mounts the kubelet's directories and the state directory from the
// host at the paths the agent uses where not told otherwise (contract/host_layout.h); the state
// directory at the same path inside, since the kubelet mounts its files into containers.
// Where the DaemonSet in `file` mounts host paths: the path inside -> the host path; and its
// container's command.
std::map<std::string, std::string> host_mounts(const std::string& file, YAML::Node& command) {
  const std::vector<YAML::Node> documents =
      YAML::LoadAllFromFile(std::string(TESSERA_SOURCE_DIR) + "/deploy/" + file);
  const auto daemon_set = std::find_if(documents.begin(), documents.end(), [](const YAML::Node& d) {
    return d["kind"].as<std::string>("") == "DaemonSet";
  });
  if (daemon_set == documents.end()) {
    ADD_FAILURE() << file << " has no DaemonSet";
    return {};
  }
  const YAML::Node spec = (*daemon_set)["spec"]["template"]["spec"];
  std::map<std::string, std::string> host_paths;  // volume -> host path
  for (const YAML::Node& volume : spec["volumes"]) {
    if (volume["hostPath"]) {
      host_paths[volume["name"].as<std::string>()] = volume["hostPath"]["path"].as<std::string>();
    }
  }
  std::map<std::string, std::string> mounted;
  const YAML::Node container = spec["containers"][0];
  command = container["command"];
  for (const YAML::Node& mount : container["volumeMounts"]) {
    const auto host = host_paths.find(mount["name"].as<std::string>());
    if (host != host_paths.end()) mounted[mount["mountPath"].as<std::string>()] = host->second;
  }
  return mounted;
}

TEST(Manifests, TheNodeAgentMountsTheHostPathsItUsesAtThoseSamePaths) {
  YAML::Node command;
  std::map<std::string, std::string> mounted = host_mounts("tessera-node.yaml", command);
  for (const std::string& path :
       {std::string(contract::kDefaultStateDirectory),
        std::string(contract::kKubeletDevicePluginDirectory),
        std::filesystem::path(contract::kKubeletPodResourcesSocket).parent_path().string()}) {
    EXPECT_EQ(mounted[path], path) << "deploy/tessera-node.yaml: " << path;
  }
  const std::string state_dir = flag(command, "--state-dir");
  EXPECT_TRUE(state_dir.empty() || state_dir == contract::kDefaultStateDirectory) << state_dir;

  // The DRA driver's: the kubelet's plugin directories and the runtime's CDI directory too,
  // and the flags that name them say the same paths.
  mounted = host_mounts("dra/tessera-node-dra.yaml", command);
  for (const auto& [path, named_by] : std::vector<std::pair<std::string, std::string>>{
           {contract::kDefaultStateDirectory, "--state-dir"},
           {contract::kKubeletPluginsRegistry, "--plugins-registry-dir"},
           {contract::kKubeletPluginsDirectory, "--plugins-dir"},
           {contract::kCdiDirectory, "--cdi-dir"}}) {
    EXPECT_EQ(mounted[path], path) << "deploy/dra/tessera-node-dra.yaml: " << path;
    const std::string given = flag(command, named_by);
    EXPECT_TRUE(given.empty() || given == path) << named_by << "=" << given;
  }
}

}  // namespace
}  // namespace tessera::test
