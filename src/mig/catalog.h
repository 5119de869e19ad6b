// MIG profiles per GPU model: what `nvidia-smi mig -lgip` and `-lgipp` show (docs/mig.md).
// The built-in catalog serves offline planning; on a machine with GPUs the catalog is read
// from NVML (nvml_catalog.h), and on the simulated GPU the two must agree.
//
// A GPU has memory slices (8 on A100/H100/H200, 4 on A30) and compute slices (7, 4). A GPU
// instance of a profile takes `memory_slices` consecutive memory slices starting at one of
// the profile's legal starts; instances may not overlap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::mig {

// NVML's GPU instance profile numbers (NVML_GPU_INSTANCE_PROFILE_*), which the catalog and
// nvmlDeviceGetGpuInstanceProfileInfo are indexed by.
inline constexpr unsigned kProfile1Slice = 0;
inline constexpr unsigned kProfile2Slice = 1;
inline constexpr unsigned kProfile3Slice = 2;
inline constexpr unsigned kProfile4Slice = 3;
inline constexpr unsigned kProfile7Slice = 4;
inline constexpr unsigned kProfile1SliceRev1 = 7;  // 1g with media engines (+me)
inline constexpr unsigned kProfile2SliceRev1 = 8;  // 2g with media engines (A30)
inline constexpr unsigned kProfile1SliceRev2 = 9;  // 1g with two memory slices
inline constexpr unsigned kProfileCount = 10;

struct Profile {
  std::string name;           // "1g.10gb", "1g.10gb+me"
  unsigned nvml_profile = 0;  // NVML_GPU_INSTANCE_PROFILE_*
  unsigned id = 0;            // the profile ID nvidia-smi shows (19, 20, 15, 14, 9, 5, 0)
  int compute_slices = 0;     // the "Ng"
  int memory_slices = 0;      // slices a placement takes
  std::vector<int> starts;    // legal placement starts, in memory slices
  int most = 0;               // instances of it the GPU can hold at once
  std::uint64_t memory_mib = 0;
  int sm_count = 0;
  bool media = false;  // +me: has the GPU's media engines (at most one such instance)
};

struct GpuModel {
  std::string key;                 // "A100-40GB"
  std::vector<std::string> names;  // NVML names of the model's variants
  int memory_slices = 0;
  int compute_slices = 0;
  std::vector<Profile> profiles;

  const Profile* profile_named(const std::string& name) const;
  const Profile* profile_with_nvml_index(unsigned nvml_profile) const;
};

// The built-in catalog: A100-40GB, A100-80GB, H100-80GB, H100-NVL (94 GB), H200 (141 GB), A30.
const std::vector<GpuModel>& builtin_catalog();
// The model an NVML device name ("NVIDIA A100-SXM4-80GB") or a key ("A100-80GB") names, or
// null when none does.
const GpuModel* find_model(const std::string& name);

// A profile's name as Kubernetes resources spell it: "1g.10gb+me" -> "1g.10gb.me".
std::string resource_profile_name(const std::string& profile);

}  // namespace tessera::mig
