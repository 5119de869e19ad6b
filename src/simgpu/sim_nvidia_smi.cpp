// The simulated nvidia-smi, for what tessera node asks of it: `compute-policy` (a GPU's time
// slice, read and set as NVIDIA's tool does), recorded in the simulated machine. Anything else
// is refused, so a caller relying on more fails a test rather than passing unseen.
// Usage: nvidia-smi compute-policy [-i INDEX] (--set-timeslice 0|1|2|3 | -l)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error_text.h"
#include "simgpu/sim_machine.h"

using tessera::sim::Machine;

namespace {

const char* const kTimeslices[] = {"Default", "Short", "Medium", "Long"};

int usage(const char* why) {
  std::fprintf(stderr, "nvidia-smi (simulated): %s\n", why);
  return 2;  // NVIDIA's exit status for an invalid argument
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "compute-policy") != 0) {
    return usage("only compute-policy is simulated");
  }
  int gpu = -1;
  long timeslice = -1;
  bool list = false;
  for (int i = 2; i < argc; ++i) {
    const std::string argument = argv[i];
    const bool has_value = i + 1 < argc;
    if ((argument == "-i" || argument == "--id") && has_value) {
      char* end = nullptr;
      gpu = static_cast<int>(std::strtol(argv[++i], &end, 10));
      if (*end != '\0') return usage("-i takes a GPU index");
    } else if (argument == "--set-timeslice" && has_value) {
      char* end = nullptr;
      timeslice = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || timeslice < 0 || timeslice > 3) {
        return usage("--set-timeslice takes 0 (default), 1 (short), 2 (medium) or 3 (long)");
      }
    } else if (argument == "-l" || argument == "--list") {
      list = true;
    } else {
      return usage(("unknown argument " + argument.substr(0, 64)).c_str());
    }
  }
  if (list == (timeslice >= 0)) return usage("give one of --set-timeslice or -l");
  Machine& machine = tessera::sim::machine();
  tessera::ErrorText error;
  if (!machine.attach(error)) {
    std::fprintf(stderr, "nvidia-smi (simulated): %s\n", error.text);
    return 9;  // NVIDIA's: the driver is not loaded
  }
  if (gpu >= machine.gpu_count()) return usage("no GPU with that index");
  for (int g = gpu < 0 ? 0 : gpu; g < (gpu < 0 ? machine.gpu_count() : gpu + 1); ++g) {
    if (list) {
      std::printf("GPU %d: timeslice %s\n", g, kTimeslices[machine.compute_timeslice(g) & 3]);
    } else {
      machine.set_compute_timeslice(g, static_cast<std::uint32_t>(timeslice));
      std::printf("Set timeslice to %s for GPU %d\n", kTimeslices[timeslice], g);
    }
  }
  return 0;
}
