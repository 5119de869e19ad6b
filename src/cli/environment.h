// Where the tessera command finds its parts and the machine's GPUs: the hook library,
// the simulated driver, the NVIDIA driver if there is one, and the runtime directory that
// holds the group ledgers.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::cli {

struct Installation {
  std::string hook_library;   // libtessera-cuda.so
  std::string simulator_dir;  // holds the simulated libcuda.so.1 and libnvidia-ml.so.1
};

// Finds the parts next to the running executable (build tree or installed layout), or
// where TESSERA_HOOK_LIBRARY / TESSERA_SIM_LIBRARY_DIR say. Throws with what is missing.
Installation locate_installation();

// True when the GPUs seen are simulated: no NVIDIA driver could be loaded, or
// TESSERA_SIMULATE=1 asks for it. TESSERA_SIMULATE=0 forbids the simulation.
bool use_simulated_gpu(const Installation& installation);

// The directory of group ledgers: TESSERA_RUNTIME_DIR, or /dev/shm/tessera-<uid>; created
// (mode 0700) if missing.
std::string runtime_directory();

// A size for people: "8.00 GiB".
std::string human_size(std::uint64_t bytes);

// Prepends `entry` to a colon-separated environment variable.
void prepend_to_path_variable(const char* variable, const std::string& entry, char separator);

}  // namespace tessera::cli
