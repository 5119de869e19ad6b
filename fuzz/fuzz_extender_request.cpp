// kube-scheduler's ExtenderArgs as the extender receives them on /filter and /prioritize, and
// ExtenderPreemptionArgs on /preempt (the first byte chooses): any body is answered 200 or
// refused with 400 and a reason; none crashes or hangs it.
// (Bind bodies go to the API server once read; the extender tests cover them.)
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

namespace {

Extender& extender() {
  // Nothing listens there: filter and prioritize decide from the nodes in the body.
  static Extender instance(tessera::sched::Policy::fgd,
                           std::make_unique<ApiCluster>(
                               ApiClientOptions{.server = "http://127.0.0.1:9", .attempts = 1}));
  return instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const HttpReply reply = data[0] % 3 == 0   ? extender().filter(body)
                          : data[0] % 3 == 1 ? extender().prioritize(body)
                                             : extender().preempt(body);
  if (reply.status != 200 && reply.status != 400) broken("a body got neither 200 nor 400");
  if (reply.status == 400 && reply.body.empty()) broken("a refusal without a reason");
  return 0;
}
