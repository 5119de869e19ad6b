// The opaque config a ResourceClaim or DeviceClass gives the DRA driver (Tessera's GpuSharing,
// NVIDIA's GpuConfig), as anyone who may create a claim writes it: whatever the bytes, reading
// gives a config within its bounds or a DraConfigError naming the field.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dra/sharing_config.h"
#include "fuzz_input.h"
#include "kube/json_input.h"

using namespace tessera;
using tessera::fuzz::broken;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nlohmann::json parameters;
  try {
    parameters =
        kube::parse_outside_json(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const std::exception&) {
    return 0;
  }
  dra::SharingConfig config;
  try {
    config = dra::parse_sharing_config(parameters);
  } catch (const dra::DraConfigError& refused) {
    if (std::string_view(refused.what()).find(':') == std::string_view::npos) {
      broken("a refusal that names no field");
    }
    return 0;
  }
  if (config.mps_thread_percentage < 0 || config.mps_thread_percentage > 100) {
    broken("an MPS thread percentage out of range was accepted");
  }
  if (config.burst && config.strategy != dra::SharingConfig::Strategy::limits) {
    broken("burst was accepted with a strategy that has no shares");
  }
  if ((config.strategy == dra::SharingConfig::Strategy::time_slicing) == config.interval.empty()) {
    broken("a time-slicing interval without time slicing, or time slicing without one");
  }
  return 0;
}
