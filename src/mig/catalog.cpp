#include "mig/catalog.h"

#include <algorithm>
#include <cctype>

#include "base/strings.h"

namespace tessera::mig {
namespace {

// The sizes that make up a model's profiles: an A100/H100-class GPU's seven (8 memory slices,
// 7 compute slices), named per model; memory in MiB and SMs as NVML reports them.
struct Sizes {
  const char* names[7];         // 1g, 1g+me, 1g (2 slices), 2g, 3g, 4g, 7g
  std::uint64_t memory_mib[4];  // for 1, 2, 4 and 8 memory slices
  const int* sms;               // 7, in the order of the names
};

constexpr int kAmpereSms[7] = {14, 14, 14, 28, 42, 56, 98};
constexpr int kHopperSms[7] = {16, 16, 26, 32, 60, 64, 132};

GpuModel eight_slice_model(const char* key, std::vector<std::string> names, const Sizes& sizes) {
  GpuModel model{key, std::move(names), 8, 7, {}};
  const std::uint64_t* memory = sizes.memory_mib;
  // One profile a row, as nvidia-smi mig -lgip lists them: name, NVML profile, ID, compute
  // slices, memory slices, starts, most, memory, SMs, media.
  // clang-format off
  model.profiles = {
      {sizes.names[0], kProfile1Slice,     19, 1, 1, {0, 1, 2, 3, 4, 5, 6}, 7, memory[0], sizes.sms[0], false},
      {sizes.names[1], kProfile1SliceRev1, 20, 1, 1, {0, 1, 2, 3, 4, 5, 6}, 1, memory[0], sizes.sms[1], true},
      {sizes.names[2], kProfile1SliceRev2, 15, 1, 2, {0, 2, 4, 6},          4, memory[1], sizes.sms[2], false},
      {sizes.names[3], kProfile2Slice,     14, 2, 2, {0, 2, 4},             3, memory[1], sizes.sms[3], false},
      {sizes.names[4], kProfile3Slice,      9, 3, 4, {0, 4},                2, memory[2], sizes.sms[4], false},
      {sizes.names[5], kProfile4Slice,      5, 4, 4, {0},                   1, memory[2], sizes.sms[5], false},
      {sizes.names[6], kProfile7Slice,      0, 7, 8, {0},                   1, memory[3], sizes.sms[6], false},
  };
  // clang-format on
  return model;
}

std::vector<GpuModel> make_catalog() {
  std::vector<GpuModel> catalog;
  catalog.push_back(eight_slice_model(
      "A100-40GB", {"NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB PCIe"},
      {{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
       {4864, 9856, 20096, 40448},
       kAmpereSms}));
  catalog.push_back(eight_slice_model(
      "A100-80GB", {"NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"},
      {{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
       {9728, 19968, 40192, 80896},
       kAmpereSms}));
  catalog.push_back(eight_slice_model(
      "H100-80GB", {"NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100"},
      {{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
       {9984, 20096, 40448, 81152},
       kHopperSms}));
  catalog.push_back(eight_slice_model(
      "H100-NVL", {"NVIDIA H100 NVL"},
      {{"1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"},
       {11264, 22784, 46080, 93184},
       kHopperSms}));
  catalog.push_back(eight_slice_model(
      "H200", {"NVIDIA H200", "NVIDIA H200 NVL"},
      {{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
       {16384, 33280, 71424, 143360},  // read from NVML on an H200, driver 580.159.04
       kHopperSms}));
  // The A30: 4 memory slices and 4 compute slices, two media variants.
  GpuModel a30{"A30", {"NVIDIA A30"}, 4, 4, {}};
  // clang-format off
  a30.profiles = {
      {"1g.6gb",     kProfile1Slice,     14, 1, 1, {0, 1, 2, 3}, 4, 5952,  14, false},
      {"1g.6gb+me",  kProfile1SliceRev1, 21, 1, 1, {0, 1, 2, 3}, 1, 5952,  14, true},
      {"2g.12gb",    kProfile2Slice,      5, 2, 2, {0, 2},       2, 12032, 28, false},
      {"2g.12gb+me", kProfile2SliceRev1,  6, 2, 2, {0, 2},       1, 12032, 28, true},
      {"4g.24gb",    kProfile4Slice,      0, 4, 4, {0},          1, 24320, 56, false},
  };
  // clang-format on
  catalog.push_back(std::move(a30));
  return catalog;
}

}  // namespace

const Profile* GpuModel::profile_named(const std::string& name) const {
  for (const Profile& profile : profiles) {
    if (profile.name == name) return &profile;
  }
  return nullptr;
}

const Profile* GpuModel::profile_with_nvml_index(unsigned nvml_profile) const {
  for (const Profile& profile : profiles) {
    if (profile.nvml_profile == nvml_profile) return &profile;
  }
  return nullptr;
}

const std::vector<GpuModel>& builtin_catalog() {
  static const std::vector<GpuModel> catalog = make_catalog();
  return catalog;
}

const GpuModel* find_model(const std::string& name) {
  const std::string wanted = base::lower(name);
  for (const GpuModel& model : builtin_catalog()) {
    if (base::lower(model.key) == wanted) return &model;
    for (const std::string& variant : model.names) {
      if (base::lower(variant) == wanted) return &model;
    }
  }
  return nullptr;
}

std::string resource_profile_name(const std::string& profile) {
  std::string name = profile;
  const std::size_t plus = name.find('+');
  if (plus != std::string::npos) name[plus] = '.';
  return name;
}

}  // namespace tessera::mig
