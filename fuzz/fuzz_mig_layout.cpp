// The tessera.io/mig-layout annotation, as anyone who may edit a node can write it: whatever
// the bytes, reading gives a bounded layout or std::invalid_argument, and planning an accepted
// layout on each GPU model gives a legal cut of what was asked or a refusal with a reason.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fuzz_input.h"
#include "mig/planner.h"
#include "node/mig_layout.h"

using namespace tessera;
using tessera::fuzz::broken;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  node::WantedMigLayout wanted;
  try {
    wanted = node::parse_mig_layout(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const std::invalid_argument& refused) {
    if (std::string(refused.what()).empty()) broken("a refusal without a reason");
    return 0;
  }
  int planned = 0;
  for (const auto& [gpu, counts] : wanted) {
    if (gpu > 63) broken("a GPU index out of range accepted");
    for (const auto& [profile, count] : counts) {
      if (count < 0 || count > 7) broken("a count out of range accepted");
      if (profile.empty() || profile.size() > 32) broken("a profile name out of bounds accepted");
    }
    if (++planned > 8) return 0;  // bounded work per input
    for (const mig::GpuModel& model : mig::builtin_catalog()) {
      const mig::Reconciliation plan = mig::reconcile(model, {}, counts, false);
      if (plan.ok && !mig::legal(model, plan.result)) broken("an illegal layout planned");
      if (!plan.ok && plan.why.empty()) broken("a refusal without a reason");
    }
  }
  return 0;
}
