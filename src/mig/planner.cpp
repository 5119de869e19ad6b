#include "mig/planner.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>

namespace tessera::mig {
namespace {

std::uint32_t slices_of(const Instance& instance) {
  return ((1u << instance.profile->memory_slices) - 1) << instance.start;
}

std::string starts_text(const Profile& profile) {
  std::string text;
  for (const int start : profile.starts) text += (text.empty() ? "" : ",") + std::to_string(start);
  return "{" + text + "}";
}

// The search: instances of `todo` from `next` on, into the slices `used` leaves free.
bool search(const std::vector<const Profile*>& todo, std::size_t next, std::uint32_t used,
            int last_start, Layout& layout) {
  if (next == todo.size()) return true;
  const Profile& profile = *todo[next];
  // Instances of one profile go in rising order: the same layout is not tried twice.
  const bool same_as_last = next > 0 && todo[next - 1] == todo[next];
  for (const int start : profile.starts) {
    if (same_as_last && start <= last_start) continue;
    const Instance candidate{&profile, start};
    if ((slices_of(candidate) & used) != 0) continue;
    layout.push_back(candidate);
    if (search(todo, next + 1, used | slices_of(candidate), start, layout)) return true;
    layout.pop_back();
  }
  return false;
}

// The quick refusals: a profile the model lacks, more of one than the GPU holds, more slices
// than are free. Empty when none applies.
std::string quick_refusal(const GpuModel& model, const std::vector<const Profile*>& todo,
                          const Layout& fixed) {
  int memory = 0, compute = 0, media = 0;
  std::map<const Profile*, int> count;
  for (const Instance& instance : fixed) {
    memory += instance.profile->memory_slices;
    compute += instance.profile->compute_slices;
    media += instance.profile->media;
    ++count[instance.profile];
  }
  for (const Profile* profile : todo) {
    memory += profile->memory_slices;
    compute += profile->compute_slices;
    media += profile->media;
    if (++count[profile] > profile->most) {
      return fmt::format("{} holds at most {} {}", model.key, profile->most, profile->name);
    }
  }
  if (media > 1) return fmt::format("{} has media engines for one +me instance only", model.key);
  if (memory > model.memory_slices) {
    return fmt::format("they take {} memory slices; {} has {}", memory, model.key,
                       model.memory_slices);
  }
  if (compute > model.compute_slices) {
    return fmt::format("they take {} compute slices; {} has {}", compute, model.key,
                       model.compute_slices);
  }
  return {};
}

std::vector<const Profile*> expand(const GpuModel& model, const ProfileCounts& wanted,
                                   std::string& why) {
  std::vector<const Profile*> todo;
  for (const auto& [name, count] : wanted) {
    const Profile* profile = model.profile_named(name);
    if (profile == nullptr) {
      std::string names;
      for (const Profile& known : model.profiles) names += (names.empty() ? "" : ", ") + known.name;
      why = fmt::format("{} is not a MIG profile of {} (its profiles: {})", name, model.key, names);
      return {};
    }
    if (count < 0 || count > 64) {
      why = fmt::format("{} x{} is not a count of instances", name, count);
      return {};
    }
    todo.insert(todo.end(), static_cast<std::size_t>(count), profile);
  }
  // The largest first, and among equals the one with fewest places to go.
  std::stable_sort(todo.begin(), todo.end(), [](const Profile* a, const Profile* b) {
    if (a->memory_slices != b->memory_slices) return a->memory_slices > b->memory_slices;
    return a->starts.size() < b->starts.size();
  });
  return todo;
}

bool fits(const GpuModel& model, const std::vector<const Profile*>& todo, const Layout& fixed,
          Layout& layout) {
  if (!quick_refusal(model, todo, fixed).empty()) return false;
  std::uint32_t used = 0;
  for (const Instance& instance : fixed) used |= slices_of(instance);
  layout = fixed;
  return search(todo, 0, used, -1, layout);
}

}  // namespace

bool legal(const GpuModel& model, const Layout& layout, std::string* why) {
  auto refuse = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  std::uint32_t used = 0;
  int compute = 0, media = 0;
  std::map<const Profile*, int> count;
  for (const Instance& instance : layout) {
    const Profile& profile = *instance.profile;
    if (std::find(profile.starts.begin(), profile.starts.end(), instance.start) ==
        profile.starts.end()) {
      return refuse(fmt::format("{} cannot start at slice {} (it starts at {})", profile.name,
                                instance.start, starts_text(profile)));
    }
    if ((slices_of(instance) & used) != 0) {
      return refuse(
          fmt::format("{} at slice {} overlaps another instance", profile.name, instance.start));
    }
    used |= slices_of(instance);
    compute += profile.compute_slices;
    media += profile.media;
    if (++count[&profile] > profile.most) {
      return refuse(fmt::format("{} holds at most {} {}", model.key, profile.most, profile.name));
    }
  }
  if (media > 1)
    return refuse(fmt::format("{} has media engines for one +me instance only", model.key));
  if (compute > model.compute_slices) {
    return refuse(fmt::format("{} compute slices are more than {} has ({})", compute, model.key,
                              model.compute_slices));
  }
  return true;
}

Plan place(const GpuModel& model, const ProfileCounts& wanted, const Layout& fixed) {
  Plan plan;
  std::string why;
  const std::vector<const Profile*> todo = expand(model, wanted, why);
  if (!why.empty()) {
    plan.why = why;
    return plan;
  }
  if (fits(model, todo, fixed, plan.layout)) {
    plan.found = true;
    return plan;
  }
  plan.layout.clear();
  plan.why = quick_refusal(model, todo, fixed);
  if (plan.why.empty()) {
    std::string rules;
    for (const auto& [name, count] : wanted) {
      const Profile& profile = *model.profile_named(name);
      if (count > 0) {
        rules += fmt::format("{}{} takes {} slice{} from {}", rules.empty() ? "" : "; ", name,
                             profile.memory_slices, profile.memory_slices == 1 ? "" : "s",
                             starts_text(profile));
      }
    }
    plan.why = fmt::format("no placement holds them together on {} ({})", model.key, rules);
  }
  plan.why = fmt::format("{} does not fit: {}", counts_text(wanted), plan.why);
  // The nearest layouts that do: the request with the fewest instances taken out. Bounded:
  // a request of many instances has many subsets, and three suggestions are enough.
  int tries = 0;
  constexpr int kMostTries = 2000;
  for (std::size_t removed = 1;
       removed <= todo.size() && plan.nearest.empty() && tries < kMostTries; ++removed) {
    std::vector<bool> out(todo.size(), false);
    std::fill(out.begin(), out.begin() + static_cast<long>(removed), true);
    do {
      std::vector<const Profile*> kept;
      ProfileCounts counts;
      for (std::size_t i = 0; i < todo.size(); ++i) {
        if (!out[i]) {
          kept.push_back(todo[i]);
          ++counts[todo[i]->name];
        }
      }
      Layout ignored;
      if (fits(model, kept, fixed, ignored) &&
          std::find(plan.nearest.begin(), plan.nearest.end(), counts) == plan.nearest.end()) {
        plan.nearest.push_back(counts);
      }
    } while (std::prev_permutation(out.begin(), out.end()) && plan.nearest.size() < 3 &&
             ++tries < kMostTries);
  }
  return plan;
}

Reconciliation reconcile(const GpuModel& model, const std::vector<Existing>& current,
                         const ProfileCounts& wanted, bool force) {
  Reconciliation result;
  std::string why;
  expand(model, wanted, why);
  if (!why.empty()) {
    result.why = why;
    return result;
  }
  const std::size_t n = current.size();
  if (n > 16) {
    result.why = fmt::format("{} GPU instances is more than a GPU has", n);
    return result;
  }
  // The kept set with the most instances wins: each one kept is a destroy and a create saved.
  int best_kept = -1;
  std::uint32_t best_mask = 0;
  Layout best_layout;
  for (std::uint32_t mask = 0; mask < (1u << n); ++mask) {
    const int kept = __builtin_popcount(mask);
    if (kept <= best_kept) continue;
    Layout fixed;
    ProfileCounts left = wanted;
    bool usable = true;
    for (std::size_t i = 0; i < n && usable; ++i) {
      const bool keep = (mask >> i) & 1u;
      if (!keep && current[i].in_use && !force) usable = false;
      if (keep) {
        fixed.push_back(current[i].instance);
        usable = --left[current[i].instance.profile->name] >= 0;  // no more than wanted
      }
    }
    if (!usable) continue;
    const Plan plan = place(model, left, fixed);
    if (!plan.found) continue;
    best_kept = kept;
    best_mask = mask;
    best_layout = plan.layout;
  }
  if (best_kept < 0) {
    for (const Existing& existing : current) {
      if (existing.in_use && !force) {
        result.why = fmt::format(
            "GPU instance {} ({} at slice {}) is in use, and {} has no room for it beside the "
            "rest; "
            "stop its processes, or use --force",
            existing.id, existing.instance.profile->name, existing.instance.start,
            counts_text(wanted));
        return result;
      }
    }
    result.why = place(model, wanted).why;
    return result;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (((best_mask >> i) & 1u) == 0)
      result.steps.push_back({Step::Kind::destroy, current[i].instance, current[i].id});
  }
  for (std::size_t i = static_cast<std::size_t>(best_kept); i < best_layout.size(); ++i) {
    result.steps.push_back({Step::Kind::create, best_layout[i], 0});
  }
  result.ok = true;
  result.result = best_layout;
  return result;
}

std::string picture(const GpuModel& model, const Layout& layout) {
  constexpr int kCell = 11;  // characters per memory slice
  std::string row;
  for (int slice = 0; slice < model.memory_slices;) {
    const Instance* here = nullptr;
    for (const Instance& instance : layout) {
      if (instance.start == slice) here = &instance;
    }
    const int width = here != nullptr ? here->profile->memory_slices : 1;
    const std::string label = here != nullptr ? here->profile->name : "free";
    const int room = width * kCell - 1;
    row += "|" + label.substr(0, static_cast<std::size_t>(room));
    row += std::string(static_cast<std::size_t>(std::max(0, room - static_cast<int>(label.size()))),
                       ' ');
    slice += width;
  }
  return row + "|";
}

ProfileCounts counts_of(const Layout& layout) {
  ProfileCounts counts;
  for (const Instance& instance : layout) ++counts[instance.profile->name];
  return counts;
}

std::string counts_text(const ProfileCounts& counts) {
  std::string text;
  for (const auto& [name, count] : counts) {
    if (count > 0) text += fmt::format("{}{} x{}", text.empty() ? "" : " + ", name, count);
  }
  return text.empty() ? "nothing" : text;
}

}  // namespace tessera::mig
