// Lines of a watch of nodes or pods as the API server streams them: every line is applied,
// reported or ends the watch; none crashes the extender, and filter still answers after it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "extender/extender.h"
#include "fuzz_input.h"
#include "kube/api_cluster.h"

using namespace tessera::extender;
using tessera::fuzz::broken;
using tessera::kube::ApiClientOptions;
using tessera::kube::ApiCluster;
using tessera::kube::WatchEnd;

namespace {

std::unique_ptr<Extender> fresh_extender() {
  return std::make_unique<Extender>(
      tessera::sched::Policy::fgd,
      std::make_unique<ApiCluster>(ApiClientOptions{.server = "http://127.0.0.1:9", .attempts = 1}),
      [](const std::string&) {});
}

// Filter over the nodes the watch has made known (nodeCacheCapable).
const std::string kFilterBody = R"({"pod":{"metadata":{"name":"p","namespace":"d","uid":"u"},
  "spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}},
  "nodenames":["n0","n1","gpu-node"]})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Watched state grows with every new name the fuzzer makes up: start afresh now and then.
  static std::unique_ptr<Extender> extender = fresh_extender();
  static int runs = 0;
  if (++runs % 4096 == 0) extender = fresh_extender();
  if (size == 0) return 0;
  const auto resource = (data[0] & 1) ? Extender::Resource::pods : Extender::Resource::nodes;
  const std::string line(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string version, why;
  const WatchEnd end = extender->apply_event(resource, line, version, why);
  if (end == WatchEnd::broken && why.empty()) broken("a broken watch without a reason");
  const HttpReply reply = extender->filter(kFilterBody);
  if (reply.status != 200) broken("filter failed after a watch event");
  return 0;
}
