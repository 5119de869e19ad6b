#include "simgpu/sim_machine.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tessera::sim {
namespace {

constexpr char kMagic[8] = {'T', 'E', 'S', 'S', 'S', 'I', 'M', 'G'};
constexpr std::uint32_t kVersion = 1;

void initialize_file(void* base, const void* context) {
  auto* file = static_cast<MachineFile*>(base);
  std::memcpy(file->magic, kMagic, sizeof kMagic);
  file->version = kVersion;
  file->file_bytes = sizeof(MachineFile);
  std::memcpy(&file->spec, context, sizeof(MachineSpec));
  initialize_accounts(file->accounts);
}

std::uint64_t hash_bytes(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

}  // namespace

bool Machine::attach(ErrorText& error) {
  if (file_ != nullptr) return true;
  MachineSpec spec;
  if (!machine_spec_from_environment(spec, error)) return false;
  char path[4096];
  if (const char* explicit_path = std::getenv("TESSERA_SIM_STATE"); explicit_path != nullptr) {
    std::snprintf(path, sizeof path, "%s", explicit_path);
  } else {
    std::snprintf(path, sizeof path, "/dev/shm/tessera-sim-%u-%016llx",
                  static_cast<unsigned>(getuid()),
                  static_cast<unsigned long long>(hash_bytes(&spec, sizeof spec)));
  }
  if (!map_shared_file(path, sizeof(MachineFile), initialize_file, &spec, mapping_, error)) {
    return false;
  }
  auto* file = static_cast<MachineFile*>(mapping_.base);
  int bad_slot = 0;
  if (std::memcmp(file->magic, kMagic, sizeof kMagic) != 0 || file->version != kVersion ||
      file->file_bytes != sizeof(MachineFile) || !accounts_look_valid(file->accounts, bad_slot)) {
    mapping_.close();
    return error.set("%s: not a simulated-GPU state file of this version", path);
  }
  if (std::memcmp(&file->spec, &spec, sizeof spec) != 0) {
    mapping_.close();
    return error.set(
        "%s: was made for a different device list; set TESSERA_SIM_STATE to a new "
        "path or remove the file",
        path);
  }
  accounts_.attach(&file->accounts, mapping_.fd);
  if (!accounts_.join(error)) {
    mapping_.close();
    return false;
  }
  file_ = file;
  return true;
}

void Machine::after_fork_in_child() {
  if (file_ == nullptr) return;
  mapping_.reopen_in_child();
  accounts_.forget_slot();  // the child joins on its first charge
}

bool Machine::charge(int device, std::uint64_t bytes) {
  ErrorText ignored;
  if (!accounts_.join(ignored)) return false;
  return accounts_.reserve(device, bytes, file_->spec.devices[device].memory_bytes);
}

// Runs when the process exits (or the library is unloaded).
[[gnu::destructor]] void release_at_exit() {
  if (machine().attached()) machine().release_process();
}

Machine& machine() {
  static Machine instance;  // constant-initialised: no guard, no destructor ordering issue
  return instance;
}

}  // namespace tessera::sim
