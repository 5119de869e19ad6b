// The simulated machine as every process sees it: the device list and each device's
// memory in use, in one shared file, so physical capacity holds across all processes on
// the host. Like the real driver, a process's device memory is returned when it dies or
// execs (common/member_accounts.h).
//
// The file is TESSERA_SIM_STATE, or /dev/shm/tessera-sim-<uid>-<hash of the device list>.
#pragma once

#include <cstdint>

#include "common/error_text.h"
#include "common/member_accounts.h"
#include "common/shared_file.h"
#include "simgpu/sim_config.h"

namespace tessera::sim {

struct MachineFile {
  char magic[8];
  std::uint32_t version;
  std::uint32_t file_bytes;
  MachineSpec spec;
  SharedAccounts accounts;  // per process, per device bytes in use
};

class Machine {
 public:
  // Reads the configuration and maps the shared state; idempotent. Async-safe to retry.
  bool attach(ErrorText& error);
  bool attached() const { return file_ != nullptr; }
  const MachineSpec& spec() const { return file_->spec; }

  // Takes bytes of device memory; false when the device is full.
  bool charge(int device, std::uint64_t bytes);
  void uncharge(int device, std::uint64_t bytes) { accounts_.release(device, bytes); }
  std::uint64_t used(int device) { return accounts_.usage(device).used; }
  std::uint64_t peak(int device) { return accounts_.usage(device).peak; }
  int processes(int device, std::int32_t* pids, std::uint64_t* used, int capacity) {
    return accounts_.list_members(device, pids, used, capacity);
  }

  void after_fork_in_child();
  // The process is exiting: like the driver, free all it held on every device now.
  void release_process() { accounts_.leave(); }

 private:
  SharedMapping mapping_;
  MachineFile* file_ = nullptr;
  MemberAccounts accounts_;
};

// The process's one machine (each simulated library has its own handle on the file).
Machine& machine();

}  // namespace tessera::sim
