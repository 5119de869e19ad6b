#include "cli/environment.h"

#include <dlfcn.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "common/units.h"

namespace tessera::cli {
namespace fs = std::filesystem;

namespace {

fs::path executable_directory() {
  return fs::read_symlink("/proc/self/exe").parent_path();
}

std::string first_existing(const std::vector<fs::path>& candidates) {
  for (const fs::path& candidate : candidates) {
    if (fs::exists(candidate)) return fs::weakly_canonical(candidate).string();
  }
  return {};
}

}  // namespace

Installation locate_installation() {
  const fs::path bin = executable_directory();
  Installation installation;
  if (const char* hook = std::getenv("TESSERA_HOOK_LIBRARY"); hook != nullptr && *hook != '\0') {
    installation.hook_library = hook;
  } else {
    installation.hook_library = first_existing(
        {bin / "../lib/libtessera-cuda.so", bin / "../lib/tessera/libtessera-cuda.so"});
  }
  if (const char* sim = std::getenv("TESSERA_SIM_LIBRARY_DIR"); sim != nullptr && *sim != '\0') {
    installation.simulator_dir = sim;
  } else {
    installation.simulator_dir = first_existing({bin / "../sim", bin / "../lib/tessera/sim"});
  }
  if (installation.hook_library.empty() || !fs::exists(installation.hook_library)) {
    throw std::runtime_error(fmt::format(
        "cannot find libtessera-cuda.so next to {} (set TESSERA_HOOK_LIBRARY)", bin.string()));
  }
  return installation;
}

bool use_simulated_gpu(const Installation& installation) {
  const char* choice = std::getenv("TESSERA_SIMULATE");
  if (choice != nullptr && std::strcmp(choice, "1") == 0) return true;
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  const bool real_driver = nvml != nullptr && dlsym(nvml, "tesseraSimulatedGpu") == nullptr;
  if (nvml != nullptr) dlclose(nvml);
  if (real_driver) return false;
  if (choice != nullptr && std::strcmp(choice, "0") == 0) {
    throw std::runtime_error(
        "no NVIDIA driver found and TESSERA_SIMULATE=0 forbids the simulated GPU");
  }
  if (installation.simulator_dir.empty()) {
    throw std::runtime_error(
        "no NVIDIA driver found, and the simulated GPU is not installed "
        "(set TESSERA_SIM_LIBRARY_DIR)");
  }
  return true;
}

std::string runtime_directory() {
  std::string directory;
  if (const char* configured = std::getenv("TESSERA_RUNTIME_DIR");
      configured != nullptr && *configured != '\0') {
    directory = configured;
  } else {
    directory = fmt::format("/dev/shm/tessera-{}", getuid());
  }
  if (mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
    throw std::runtime_error(
        fmt::format("cannot create runtime directory {}: {}", directory, std::strerror(errno)));
  }
  return directory;
}

std::string human_size(std::uint64_t bytes) {
  char text[32];
  format_size(bytes, text, sizeof text);
  return text;
}

void prepend_to_path_variable(const char* variable, const std::string& entry, char separator) {
  const char* current = std::getenv(variable);
  const std::string value =
      current != nullptr && *current != '\0' ? entry + separator + current : entry;
  setenv(variable, value.c_str(), 1);
}

}  // namespace tessera::cli
