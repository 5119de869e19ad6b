#include "node/mig_layout.h"

#include <fmt/core.h>

#include <charconv>
#include <stdexcept>
#include <vector>

#include "kube/json_input.h"
#include "node/mig_gpu.h"

namespace tessera::node {
namespace {

constexpr std::size_t kMostAnnotationBytes = 64 * 1024;
constexpr std::size_t kMostProfileName = 32;
constexpr unsigned kMostGpuIndex = 63;
constexpr int kMostInstances = 7;  // of one profile on one GPU: 7 compute slices

struct GpuPlan {
  MigGpu gpu;
  mig::ProfileCounts before;
  mig::Reconciliation plan;
};

}  // namespace

WantedMigLayout parse_mig_layout(const std::string& text) {
  if (text.size() > kMostAnnotationBytes) {
    throw std::invalid_argument(
        fmt::format("{} bytes; at most {}", text.size(), kMostAnnotationBytes));
  }
  nlohmann::json value;
  try {
    value = kube::parse_outside_json(text);
  } catch (const std::exception& error) {
    throw std::invalid_argument(error.what());
  }
  if (!value.is_object()) throw std::invalid_argument("not a JSON object of GPU indices");
  WantedMigLayout wanted;
  for (const auto& [key, counts] : value.items()) {
    unsigned gpu = 0;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), gpu);
    if (key.empty() || error != std::errc() || end != key.data() + key.size() ||
        gpu > kMostGpuIndex) {
      throw std::invalid_argument(
          fmt::format("'{}' is not a GPU index (0 to {})", key.substr(0, 16), kMostGpuIndex));
    }
    if (!counts.is_object()) {
      throw std::invalid_argument(fmt::format("GPU {}: not an object of profile counts", gpu));
    }
    mig::ProfileCounts& profiles = wanted[gpu];
    for (const auto& [profile, count] : counts.items()) {
      if (profile.empty() || profile.size() > kMostProfileName) {
        throw std::invalid_argument(fmt::format("GPU {}: '{}' is not a profile name", gpu,
                                                profile.substr(0, kMostProfileName)));
      }
      if (!count.is_number_integer() || count.get<std::int64_t>() < 0 ||
          count.get<std::int64_t>() > kMostInstances) {
        throw std::invalid_argument(fmt::format("GPU {}: {} count {} is not 0 to {}", gpu, profile,
                                                count.dump().substr(0, 32), kMostInstances));
      }
      profiles[profile] = count.get<int>();
    }
  }
  return wanted;
}

std::string apply_mig_layout(Nvml& nvml, const Inventory& inventory, const WantedMigLayout& wanted,
                             const HeldInstances& held) {
  // Every GPU checked and planned before any is touched.
  std::vector<GpuPlan> plans;
  for (const auto& [index, counts] : wanted) {
    if (index >= inventory.gpus.size()) {
      throw std::runtime_error(
          fmt::format("GPU {}: this node has {} GPU(s)", index, inventory.gpus.size()));
    }
    const GpuInfo& info = inventory.gpus[index];
    if (!info.mig_capable) throw std::runtime_error(fmt::format("GPU {}: not MIG-capable", index));
    GpuPlan plan{read_mig_gpu(nvml, info), {}, {}};
    if (!plan.gpu.enabled) {
      throw std::runtime_error(fmt::format(
          "GPU {}: MIG mode is off; turning it on needs the GPU idle and reset (tessera mig apply)",
          index));
    }
    for (const auto& [name, count] : counts) {
      if (plan.gpu.model->profile_named(name) == nullptr) {
        throw std::runtime_error(
            fmt::format("GPU {}: {} has no profile {}", index, plan.gpu.model->key, name));
      }
    }
    std::vector<mig::Existing> current = plan.gpu.existing();
    for (mig::Existing& existing : current) {
      existing.in_use = existing.in_use || held.count({index, existing.id}) > 0;
    }
    plan.before = mig::counts_of(plan.gpu.layout());
    plan.plan = mig::reconcile(*plan.gpu.model, current, counts, false);
    if (!plan.plan.ok) {
      throw std::runtime_error(fmt::format("GPU {}: {} cannot be had: {}", index,
                                           mig::counts_text(counts), plan.plan.why));
    }
    plans.push_back(std::move(plan));
  }
  std::string done;
  for (std::size_t k = 0; k < plans.size(); ++k) {
    const GpuPlan& plan = plans[k];
    try {
      apply_steps(nvml, plan.gpu, plan.plan.steps);
    } catch (const std::exception& failure) {
      // This GPU rolled itself back; the ones before it are cut back as they were.
      std::string back;
      for (std::size_t j = k; j-- > 0;) {
        const GpuPlan& earlier = plans[j];
        try {
          const MigGpu now = read_mig_gpu(nvml, earlier.gpu.gpu);
          const mig::Reconciliation undo =
              mig::reconcile(*now.model, now.existing(), earlier.before, false);
          if (!undo.ok) throw std::runtime_error(undo.why);
          apply_steps(nvml, now, undo.steps);
        } catch (const std::exception& stuck) {
          back += fmt::format("; GPU {} could not be cut back as it was: {}", earlier.gpu.gpu.index,
                              stuck.what());
        }
      }
      throw std::runtime_error(std::string(failure.what()) + back);
    }
    int destroyed = 0, created = 0;
    for (const mig::Step& step : plan.plan.steps)
      (step.kind == mig::Step::Kind::destroy ? destroyed : created) += 1;
    done += fmt::format("{}GPU {}: {} ({} destroyed, {} created)", done.empty() ? "" : "; ",
                        plan.gpu.gpu.index, mig::counts_text(mig::counts_of(plan.plan.result)),
                        destroyed, created);
  }
  return done.empty() ? "no GPU named" : done;
}

}  // namespace tessera::node
