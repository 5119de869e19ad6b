// test-kubelet: the test kubelet as a program, for the demo and for trying tessera node by
// hand. It serves kubelet.sock in DIR, waits for RESOURCE to register and list its devices
// (with --unhealthy N, until N of them are unhealthy), prints them, then with --allocate N
// allocates N of them (as the kubelet would, asking the plugin which it prefers) and prints
// what a container would get.
//
//   test-kubelet DIR RESOURCE [--allocate N] [--unhealthy N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "test_kubelet.h"

int main(int argc, char** argv) {
  int count = 0, unhealthy = 0;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string option = argv[i];
    if (option == "--allocate") count = std::atoi(argv[i + 1]);
    if (option == "--unhealthy") unhealthy = std::atoi(argv[i + 1]);
  }
  if (argc < 3 || argc % 2 == 0) {
    std::fprintf(stderr, "usage: test-kubelet DIR RESOURCE [--allocate N] [--unhealthy N]\n");
    return 2;
  }
  const std::string resource = argv[2];
  tessera::test::TestKubelet kubelet(argv[1]);
  tessera::test::TestKubelet::Devices devices;
  const auto ready = [unhealthy](const tessera::test::TestKubelet::Devices& list) {
    int sick = 0;
    for (const auto& [id, state] : list) sick += state.health != "Healthy";
    return !list.empty() && sick >= unhealthy;
  };
  if (!kubelet.wait_for_devices(resource, ready, std::chrono::seconds(20), &devices)) {
    std::fprintf(stderr, "test-kubelet: %s did not list devices (%d unhealthy) within 20 s\n",
                 resource.c_str(), unhealthy);
    return 1;
  }
  std::printf("kubelet: %s registered with %zu devices\n", resource.c_str(), devices.size());
  std::vector<std::string> available;
  for (const auto& [id, state] : devices) {
    std::printf("  %-48s %s\n", id.c_str(), state.health.c_str());
    if (state.health == "Healthy") available.push_back(id);
  }
  if (count <= 0) return 0;
  std::vector<std::string> chosen;
  grpc::Status status = kubelet.preferred(resource, available, {}, count, chosen);
  if (!status.ok()) {
    std::fprintf(stderr, "test-kubelet: GetPreferredAllocation: %s\n",
                 status.error_message().c_str());
    return 1;
  }
  v1beta1::AllocateResponse response;
  status = kubelet.allocate(resource, {chosen}, response);
  if (!status.ok()) {
    std::printf("kubelet: Allocate refused: %s\n", status.error_message().c_str());
    return 1;
  }
  std::printf("kubelet: Allocate of");
  for (const std::string& id : chosen) std::printf(" %s", id.c_str());
  std::printf("\n");
  for (const auto& container : response.container_responses()) {
    std::map<std::string, std::string> envs(container.envs().begin(), container.envs().end());
    for (const auto& [name, value] : envs)
      std::printf("  env   %s=%s\n", name.c_str(), value.c_str());
    for (const auto& mount : container.mounts()) {
      std::printf("  mount %s <- %s%s\n", mount.container_path().c_str(), mount.host_path().c_str(),
                  mount.read_only() ? " (read-only)" : "");
    }
  }
  return 0;
}
