// Which devices the simulated GPU has.
//
// TESSERA_SIM_DEVICES (or the file named by TESSERA_SIM_CONFIG, one device a line, '#'
// comments) lists devices separated by ';': a model preset (H100, H200, A100, A100-80GB,
// A30, T4, V100) optionally followed by ",key=value" overrides: memory=SIZE, sms=N,
// context=SIZE (device memory each context costs), name=TEXT, uuid=GPU-....
// With neither set there is one H100.
#pragma once

#include <cstdint>

#include "common/error_text.h"
#include "common/limits.h"

namespace tessera::sim {

// The MIG profile tables the simulated GPU has (sim_nvml.cpp), one per GPU model.
inline constexpr int kMigA100_40 = 0;
inline constexpr int kMigA100_80 = 1;
inline constexpr int kMigH100 = 2;
inline constexpr int kMigH200 = 3;
inline constexpr int kMigA30 = 4;

struct DeviceSpec {
  char name[96];
  char uuid[48];  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  char pci_bus_id[32];
  std::uint64_t memory_bytes;
  std::uint64_t context_bytes;
  int sm_count;
  int cc_major;
  int cc_minor;
  int numa_node;   // -1: not reported
  int mig_family;  // which of the simulated GPU's MIG profile tables it has; -1: no MIG
  std::uint32_t pci_device_id;  // device << 16 | vendor (0x10DE)
};

struct MachineSpec {
  int device_count = 0;
  DeviceSpec devices[kMostDevices] = {};
};

// Parses a device list; `origin` names where it came from, for messages.
bool parse_machine_spec(const char* text, const char* origin, MachineSpec& spec, ErrorText& error);

// Reads the environment (TESSERA_SIM_CONFIG, TESSERA_SIM_DEVICES) or the default.
bool machine_spec_from_environment(MachineSpec& spec, ErrorText& error);

// Fault injection for tests: TESSERA_SIM_FAIL names entry points (comma-separated) of the
// simulated driver or NVML that fail, as a real driver's do now and then, so every caller's
// failure path can be exercised. "name#N" fails only the N-th call of it in this process.
bool injected_failure(const char* entry_point);

}  // namespace tessera::sim
