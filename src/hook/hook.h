// libtessera-cuda.so: the isolation runtime, interposed between a process and the CUDA
// driver and NVML. This header is the hook's internal state; the entry points it exports
// are the CUDA/NVML functions in cuda_abi.h/nvml_abi.h lists, plus dlsym.
//
// Every exported wrapper starts with hook(), which initialises lazily (once, on the first
// call) and costs one predictable branch afterwards. With no limit configured the hook
// forwards every call untouched.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "common/error_text.h"
#include "common/handle_table.h"
#include "common/limits.h"
#include "common/mutex.h"
#include "common/priority.h"
#include "contract/layout.h"
#include "cuda_abi/cuda_abi.h"
#include "cuda_abi/nvml_abi.h"
#include "ledger/demand.h"
#include "ledger/ledger.h"

namespace tessera::hook {

using namespace tessera::abi;

#define TESSERA_DECLARE_REAL(name, params) PFN_##name name;
struct RealDriver {
  TESSERA_CUDA_HOOKED(TESSERA_DECLARE_REAL)
  TESSERA_CUDA_PASSTHROUGH(TESSERA_DECLARE_REAL)
};
struct RealNvml {
  TESSERA_NVML_HOOKED(TESSERA_DECLARE_REAL)
  TESSERA_NVML_PASSTHROUGH(TESSERA_DECLARE_REAL)
};
#undef TESSERA_DECLARE_REAL

// What this process holds on the device, per handle, so frees return exactly what
// allocations took.
struct Charge {
  int device;
  std::uint64_t bytes;
  CUcontext context;  // linear allocations and arrays die with their context
  CUmemoryPool pool;  // stream-ordered allocations are charged through their pool
};

struct PoolCharge {
  int device;
  std::uint64_t charged;  // the pool's reserved bytes as last seen
  int live_allocations;
  bool destroy_pending;
};

struct VmmCharge {
  int device;
  std::uint64_t charged;  // 0 for an imported handle until it is first mapped
  bool imported;
  bool released;
  int maps;
};

struct VmmMapping {
  CUmemGenericAllocationHandle handle;
  std::uint64_t size;
};

// The hook's locks, process-wide like the state they guard (a Hook is the process's one).
// Where two are held, pool_lock is taken before table_lock (a pool operation reads and writes
// the tables), and coordination_lock last (measuring a launch reads the coordination file).
extern Mutex table_lock;  // the tables of what is charged: allocations, pools, VMM, contexts
extern Mutex pool_lock ACQUIRED_BEFORE(table_lock);  // one pool operation at a time, so growth
                                                     // is attributed to the call that caused it
extern Mutex coordination_lock;                      // opens and repairs coordination files

// A device's coordination file (ledger/demand.h), by the CUDA ordinal this process sees the
// device as; opened at the first governed launch on it, since its key is the device's UUID.
// Once open, its mapping is kept until the process ends: threads use it without a lock, and
// damage is repaired in place.
struct DeviceCoordination {
  std::atomic<int> state;  // kNotOpened, then kOpen for good
  // Opened and repaired under coordination_lock; used without it once `state` says kOpen.
  ledger::Demand demand;
  char path[512] GUARDED_BY(coordination_lock);
  std::atomic<std::uint64_t> retry_at_ns;   // unusable: when to try it again (read unlocked)
  bool said GUARDED_BY(coordination_lock);  // its problem was logged (once until usable again)
};
enum CoordinationState { kNotOpened = 0, kOpen = 1 };

struct Hook {
  RealDriver real;
  RealNvml nvml;
  bool nvml_loaded;
  bool failed;        // misconfigured: every CUDA call fails with the reason logged once
  bool accounting;    // a ledger is open: memory is charged to the group
  ErrorText failure;  // why, if failed
  ledger::Ledger ledger;

  HandleTable<Charge> allocations GUARDED_BY(table_lock);
  HandleTable<Charge> arrays GUARDED_BY(table_lock);
  HandleTable<Charge> contexts GUARDED_BY(table_lock);
  HandleTable<PoolCharge> pools GUARDED_BY(table_lock);
  HandleTable<VmmCharge> vmm_handles GUARDED_BY(table_lock);
  HandleTable<VmmMapping> vmm_mappings GUARDED_BY(table_lock);
  struct {
    CUcontext context;
    int retains;
    std::uint64_t charged;
  } primary[kMostDevices] GUARDED_BY(table_lock);

  bool compute_limited;  // a compute share or a priority applies: launches are governed
  bool burst;            // the ledger's or the environment's word: use time no other group wants
  Priority priority;     // the lowest of the ledger's and the environment's (contract/variables.h)
  unsigned priority_tolerance;  // TESSERA_PRIORITY_TOLERANCE (high priority: what it gives up)
  // The file ledger's path (TESSERA_LEDGER or HAMi's cache), beside which the devices'
  // coordination files are (contract/layout.h); empty for a private ledger or none.
  char ledger_path[4096];
  std::uint64_t group_identity;  // this group's, in coordination files
  DeviceCoordination coordination[kMostDevices];
};

// The initialised hook; the first call in the process initialises it.
Hook& hook();
// The result every CUDA entry point returns when the hook is misconfigured.
CUresult failure_result();

// The device ordinal of the calling thread's current context, or -1 without one.
int current_device();

// The coordination file of `device` (an ordinal), opened at its first use and repaired in place
// if something wrote over it (the damage is said once, naming the file). nullptr where the group
// has no file ledger, or while the file cannot be used (said once): then nothing coordinates
// the group with others on the device, and a low-priority group must wait (launch.cpp).
ledger::Demand* coordination(int device);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML names the device with this UUID.
void format_gpu_uuid(const CUuuid& uuid, char (&text)[64]);

// Charges and releases on the group ledger.
bool charge(int device, std::uint64_t bytes);
void uncharge(int device, std::uint64_t bytes);

// Forgets the linear allocations and arrays that died with a context.
void release_context_resources(CUcontext context);

// Wrapper address for an exported name we interpose, or nullptr.
void* wrapper_by_name(const char* name);
// Wrapper for a real driver function pointer (found by address, else by the variant the
// driver would choose for symbol/version/flags), or the pointer itself if not interposed.
void* wrapper_for(const char* symbol, void* real_function, int cuda_version, cuuint64_t flags);

// Holds table_lock for its scope.
class SCOPED_CAPABILITY TableLock {
 public:
  TableLock() ACQUIRE(table_lock) { table_lock.lock(); }
  ~TableLock() RELEASE() { table_lock.unlock(); }
  TableLock(const TableLock&) = delete;
  TableLock& operator=(const TableLock&) = delete;
};

}  // namespace tessera::hook

#define HOOK_EXPORT extern "C" __attribute__((visibility("default")))

// Starts every CUDA wrapper: initialise, and fail closed if misconfigured.
#define HOOK_ENTER()                                      \
  ::tessera::hook::Hook& state = ::tessera::hook::hook(); \
  if (__builtin_expect(state.failed, 0)) return ::tessera::hook::failure_result()
