#include "mig/advisor.h"

#include <algorithm>
#include <functional>
#include <set>

namespace tessera::mig {

std::vector<Layout> every_layout(const GpuModel& model) {
  std::vector<Instance> candidates;
  for (const Profile& profile : model.profiles) {
    for (const int start : profile.starts) candidates.push_back({&profile, start});
  }
  std::set<ProfileCounts> seen;
  std::vector<Layout> layouts;
  Layout layout;
  std::function<void(std::size_t)> grow = [&](std::size_t from) {
    if (seen.insert(counts_of(layout)).second) layouts.push_back(layout);
    for (std::size_t i = from; i < candidates.size(); ++i) {
      layout.push_back(candidates[i]);
      if (legal(model, layout)) grow(i + 1);
      layout.pop_back();
    }
  };
  grow(0);
  return layouts;
}

namespace {

bool holds(const Profile& profile, const Job& job) {
  return profile.memory_mib >= job.memory_mib && profile.compute_slices >= job.compute_slices &&
         (profile.media || !job.media);
}

// The jobs (largest first) each on the smallest free instance that holds it.
GpuAdvice fill(const GpuModel& model, const Layout& layout, const std::vector<const Job*>& jobs,
               std::vector<bool>& taken) {
  GpuAdvice advice;
  advice.layout = layout;
  std::vector<const Profile*> free;
  int used_slices = 0;
  for (const Instance& instance : layout) {
    free.push_back(instance.profile);
    used_slices += instance.profile->memory_slices;
  }
  std::sort(free.begin(), free.end(), [](const Profile* a, const Profile* b) {
    return a->memory_mib != b->memory_mib ? a->memory_mib < b->memory_mib
                                          : a->compute_slices < b->compute_slices;
  });
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    if (taken[j]) continue;
    for (auto slot = free.begin(); slot != free.end(); ++slot) {
      if (holds(**slot, *jobs[j])) {
        advice.placed.emplace_back(jobs[j]->name, *slot);
        advice.placed_mib += jobs[j]->memory_mib;
        taken[j] = true;
        free.erase(slot);
        break;
      }
    }
  }
  advice.idle = free;
  advice.free_memory_slices = model.memory_slices - used_slices;
  return advice;
}

}  // namespace

Advice advise(const GpuModel& model, const std::vector<Job>& jobs, int gpus) {
  Advice advice;
  std::vector<const Job*> order;
  for (const Job& job : jobs) {
    const bool fits_any = std::any_of(model.profiles.begin(), model.profiles.end(),
                                      [&](const Profile& profile) { return holds(profile, job); });
    if (fits_any) {
      order.push_back(&job);
    } else {
      advice.unplaced.push_back(job.name + " (larger than any " + model.key + " MIG profile)");
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const Job* a, const Job* b) {
    return a->memory_mib != b->memory_mib ? a->memory_mib > b->memory_mib
                                          : a->compute_slices > b->compute_slices;
  });
  const std::vector<Layout> layouts = every_layout(model);
  std::vector<bool> taken(order.size(), false);
  for (int gpu = 0; gpu < gpus && std::find(taken.begin(), taken.end(), false) != taken.end();
       ++gpu) {
    GpuAdvice best;
    std::vector<bool> best_taken;
    bool have = false;
    for (const Layout& layout : layouts) {
      std::vector<bool> trial = taken;
      GpuAdvice candidate = fill(model, layout, order, trial);
      const auto better = [&] {
        if (!have) return true;
        if (candidate.placed.size() != best.placed.size())
          return candidate.placed.size() > best.placed.size();
        if (candidate.placed_mib != best.placed_mib) return candidate.placed_mib > best.placed_mib;
        if (candidate.idle.size() != best.idle.size())
          return candidate.idle.size() < best.idle.size();
        return candidate.free_memory_slices > best.free_memory_slices;
      };
      if (better()) {
        best = std::move(candidate);
        best_taken = std::move(trial);
        have = true;
      }
    }
    taken = best_taken;
    advice.gpus.push_back(std::move(best));
  }
  for (std::size_t j = 0; j < order.size(); ++j) {
    if (!taken[j]) advice.unplaced.push_back(order[j]->name + " (no room left)");
  }
  return advice;
}

}  // namespace tessera::mig
