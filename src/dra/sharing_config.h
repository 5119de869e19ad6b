// How a claim's containers share their GPUs: the opaque config a ResourceClaim or DeviceClass
// gives the driver, strictly read. Tessera's own (gpu.tessera.io/v1alpha1, kind GpuSharing):
//
//   apiVersion: gpu.tessera.io/v1alpha1
//   kind: GpuSharing
//   strategy: Limits            # Limits (default) | TimeSlicing | MPS
//   priority: high              # high | low | none (default)
//   burst: false                # Limits only: use device time beyond the cores no one wants
//   timeSlicing: {interval: Default}        # TimeSlicing only: Default|Short|Medium|Long
//   mps: {activeThreadPercentage: 50, pinnedMemoryLimit: 10Gi}   # MPS only
//
// NVIDIA's GpuConfig and MigDeviceConfig (resource.nvidia.com/v1beta1) are read for what they
// mean alike: sharing.strategy TimeSlicing or MPS, timeSlicingConfig.interval,
// mpsConfig.defaultActiveThreadPercentage and defaultPinnedDeviceMemoryLimit.
//
// Unknown fields, values of the wrong type or out of range, and contradictions (an mps section
// with strategy TimeSlicing) are refused with the field named.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "common/priority.h"

namespace tessera::dra {

struct DraConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SharingConfig {
  enum class Strategy { limits, time_slicing, mps };
  Strategy strategy = Strategy::limits;
  Priority priority = Priority::none;
  bool burst = false;
  std::string interval;                       // time slicing: Default, Short, Medium or Long
  int mps_thread_percentage = 0;              // 0: not set
  std::uint64_t mps_pinned_memory_bytes = 0;  // 0: not set
  bool operator==(const SharingConfig&) const = default;
};

const char* strategy_name(SharingConfig::Strategy strategy);

// The config an opaque parameters object states. Throws DraConfigError naming the field.
SharingConfig parse_sharing_config(const nlohmann::json& parameters);

}  // namespace tessera::dra
