// The simulated CUDA driver's process-local state: contexts, allocations, pools, VMM
// handles and arrays of this process. Device capacity is shared machine-wide through
// sim_machine.h; everything here dies with the process, as it does with the real driver.
#pragma once

#include <pthread.h>

#include <cstdint>

#include "common/handle_table.h"
#include "common/limits.h"
#include "common/mutex.h"
#include "cuda_abi/cuda_abi.h"
#include "simgpu/sim_config.h"
#include "simgpu/sim_mps_client.h"

namespace tessera::sim {

struct Context;
struct Graph;

// Work on a stream runs in order; last_ticket names its last submitted work on the device.
struct Stream {
  Context* context;
  std::uint64_t last_ticket;  // 0: none yet
  Graph* capture;             // while capturing, work is recorded here instead of run
};

struct Context {
  int device;  // machine device index
  int ordinal;
  Stream default_stream;
  std::uint64_t latest_ticket;  // the last work submitted in this context (the highest)
};

// A kernel: how long one wave of blocks (one per SM) runs.
struct Function {
  char name[64];
  std::uint64_t duration_ns;
};

// A captured graph, and its instantiation: the kernels' durations in order.
struct Graph {
  std::uint64_t* durations;
  int count;
  int capacity;
  std::uint64_t capture_sequence;  // while it is being captured: that capture's number
  bool invalidated;                // an illegal call during its capture (atomic access)
};

// A marker of no duration the device reaches in its process's turn (`ticket`).
struct Event {
  int device;
  std::uint64_t ticket;
  std::uint64_t recorded_ns;
  bool recorded;
  // Non-zero: last recorded into that stream capture, where it is a node of the graph, not a
  // marker on the device; the driver refuses to wait for or time it (CUDA_ERROR_CAPTURED_EVENT).
  std::uint64_t captured_sequence;
};

struct Pool {
  int device;
  std::uint64_t reserved, used, reserved_high, used_high, release_threshold;
  bool is_default;
  bool destroy_pending;
};

struct Allocation {
  Context* context;  // linear allocations die with their context; pool ones do not
  Pool* pool;
  int device;
  std::uint64_t charged;     // device bytes taken from the machine (or the pool)
  std::uint64_t host_bytes;  // host memory backing it
  bool host_mapped;          // backing came from mmap (else aligned_alloc)
};

struct VmmHandle {
  int device;  // -1 for host memory
  std::uint64_t size;
  int memfd;
  bool charged;  // this process took the device bytes (not so for imported handles)
  bool released;
  int maps;
};

struct Mapping {
  VmmHandle* handle;
  std::uint64_t size;
};

struct ArrayRecord {
  Context* context;
  int device;
  std::uint64_t bytes;
};

// Guards the driver's tables below (what is allocated, created and current); the devices a
// process sees are set once, by cuInit, and read without it.
extern Mutex driver_lock;

struct Driver {
  bool initialized;
  int device_count;
  int machine_index[kMostDevices];   // ordinal -> simulated device (after CUDA_VISIBLE_DEVICES)
  DeviceSpec visible[kMostDevices];  // ordinal -> what it is (a MIG device: its instance's)
  MpsClient mps;                     // attached to an MPS control daemon, or not
  struct {
    Context* context;
    int retains;
  } primary[kMostDevices] GUARDED_BY(driver_lock);
  Pool* default_pool[kMostDevices] GUARDED_BY(driver_lock);
  Pool* current_pool[kMostDevices] GUARDED_BY(driver_lock);
  HandleTable<Allocation> allocations GUARDED_BY(driver_lock);
  HandleTable<char> contexts GUARDED_BY(driver_lock);  // live Context* values
  HandleTable<char> pools GUARDED_BY(driver_lock);     // live Pool* values
  HandleTable<VmmHandle*> vmm_handles GUARDED_BY(driver_lock);
  HandleTable<Mapping> mappings GUARDED_BY(driver_lock);
  HandleTable<ArrayRecord> arrays GUARDED_BY(driver_lock);
};

}  // namespace tessera::sim
