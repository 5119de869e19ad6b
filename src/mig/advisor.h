// Which MIG layout fits a workload mix best (the GPU-sharing guide's selection advice, made a
// calculation; docs/mig.md): jobs by the memory and compute slices each needs, placed on the
// layouts a GPU model allows, GPU after GPU, so that the most jobs run; what each layout leaves
// unused is said.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mig/planner.h"

namespace tessera::mig {

struct Job {
  std::string name;  // how the user wrote it, for the report
  std::uint64_t memory_mib = 0;
  int compute_slices = 1;
  bool media = false;  // needs the media engines: a +me instance
};

struct GpuAdvice {
  Layout layout;
  std::vector<std::pair<std::string, const Profile*>> placed;  // job, the instance it runs on
  std::vector<const Profile*> idle;                            // instances no job uses
  std::uint64_t placed_mib = 0;                                // the placed jobs' memory
  int free_memory_slices = 0;
};

struct Advice {
  std::vector<GpuAdvice> gpus;
  std::vector<std::string> unplaced;  // jobs no profile of the model can hold, or no room left
};

// One layout of each distinct multiset of profiles the model allows (the empty one too).
std::vector<Layout> every_layout(const GpuModel& model);

// Lays out `gpus` GPUs of `model` for `jobs`: each GPU in turn takes the layout that runs the
// most of the jobs left (then the most of their memory, so that large jobs are not left for
// later; then the fewest idle instances; then the most memory left free).
Advice advise(const GpuModel& model, const std::vector<Job>& jobs, int gpus);

}  // namespace tessera::mig
