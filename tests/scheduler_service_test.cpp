// tessera scheduler as a service: several replicas with one leader (a coordination.k8s.io
// Lease on the fake API server), HTTPS with a certificate from files, and the Deployment's
// manifests in deploy/.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "fake_cluster.h"
#include "kube/api_client.h"
#include "kube/lease.h"
#include "support.h"

namespace tessera::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kLeaseKey = "kube-system/tessera-scheduler";

// A node whose GPUs Tessera places on, annotated as by hand (every GPU alike, sliceable).
nlohmann::json gpu_node(const std::string& name, int gpus) {
  nlohmann::json node = cluster_node(name);
  node["metadata"]["annotations"]["tessera.io/gpus"] = nlohmann::json{
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
  return (*object)["metadata"]["annotations"].value("tessera.io/assignment", std::string());
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
