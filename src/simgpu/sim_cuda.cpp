// The simulated CUDA driver (libcuda.so.1): the driver API on host memory, for machines
// without an NVIDIA driver. Exported names and semantics follow the driver API docs on the
// paths Tessera depends on; see docs/simulated-gpu.md for what is and is not simulated.
// This file: the driver's state, the devices it enumerates, cuInit, device queries, errors
// and cuGetProcAddress. Contexts, memory, VMM and launches are in sim_cuda_*.cpp.
#include "simgpu/sim_cuda_internal.h"

namespace tessera::sim {

constinit Mutex driver_lock;

namespace {

constexpr int kDriverVersion = 13000;

Immortal<Driver> driver_storage;

pthread_once_t driver_once = PTHREAD_ONCE_INIT;

void reset_after_fork();

void construct_driver() {
  driver_storage.construct();
  pthread_atfork(nullptr, nullptr, reset_after_fork);
}

// CUDA cannot be used across fork: the child starts with nothing and must cuInit again.
void reset_after_fork() {
  Driver& state = driver_storage.get();
  driver_lock.reset_after_fork();
  MutexLock locked(driver_lock);
  state.initialized = false;
  std::memset(state.primary, 0, sizeof state.primary);
  std::memset(state.default_pool, 0, sizeof state.default_pool);
  std::memset(state.current_pool, 0, sizeof state.current_pool);
  state.allocations.clear();
  state.contexts.clear();
  state.pools.clear();
  state.vmm_handles.clear();
  state.mappings.clear();
  state.arrays.clear();
  current_context = nullptr;
  context_depth = 0;
  forget_mps(state.mps);
  machine().after_fork_in_child();
}

// A device CUDA can enumerate: a whole GPU, or a MIG device (a compute instance; its memory
// is its GPU instance's).
struct Candidate {
  int device;  // simulated device (sim_machine.h)
  DeviceSpec spec;
};

// What the driver enumerates with no CUDA_VISIBLE_DEVICES: each GPU, or, for a GPU in MIG
// mode (which runs no CUDA work as a whole), each of its MIG devices.
int enumerate_devices(Candidate* out, int capacity) {
  const MachineSpec& spec = machine().spec();
  int count = 0;
  for (int gpu = 0; gpu < spec.device_count && count < capacity; ++gpu) {
    const DeviceSpec& whole = spec.devices[gpu];
    const MigState& mig = machine().lock_mig(gpu);
    if (mig.current == 0) {
      out[count++] = {gpu, whole};
    } else {
      for (int slot = 0; slot < kMigSlots; ++slot) {
        const MigGpuInstance& instance = mig.instances[slot];
        for (int ci = 0; instance.used != 0 && ci < kMigSlots && count < capacity; ++ci) {
          if (instance.compute[ci].used == 0) continue;
          Candidate& device = out[count++];
          device = {mig_device_id(gpu, slot), whole};
          std::snprintf(device.spec.name, sizeof device.spec.name, "%s %s", whole.name,
                        instance.name);
          format_mig_uuid(gpu, instance, ci, device.spec.uuid, sizeof device.spec.uuid);
          device.spec.memory_bytes = instance.memory_mib << 20;
          device.spec.sm_count = static_cast<int>(instance.compute[ci].sms);
          device.spec.mig_family = -1;
        }
      }
    }
    machine().unlock_mig();
  }
  return count;
}

// The candidate an entry of CUDA_VISIBLE_DEVICES names, or -1: an ordinal of the default
// enumeration, a prefix of a GPU's UUID (a GPU in MIG mode is no CUDA device), a MIG device's
// UUID (or a prefix), or MIG-<GPU UUID>/<GPU instance ID>/<compute instance ID>.
int find_candidate(const char* item, const Candidate* candidates, int count) {
  const std::size_t length = std::strlen(item);
  if (length == 0) return -1;
  if (std::strncmp(item, "GPU-", 4) == 0 || std::strncmp(item, "MIG-", 4) == 0) {
    for (int i = 0; i < count; ++i) {
      if (std::strncmp(candidates[i].spec.uuid, item, length) == 0) return i;
    }
    if (std::strncmp(item, "MIG-GPU-", 8) != 0) return -1;
    const char* slash = std::strchr(item, '/');
    unsigned gi_id = 0, ci_id = 0;
    char tail = 0;
    if (slash == nullptr || std::sscanf(slash, "/%u/%u%c", &gi_id, &ci_id, &tail) != 2) return -1;
    const std::string_view gpu_uuid(item + 4, static_cast<std::size_t>(slash - item - 4));
    const MachineSpec& spec = machine().spec();
    for (int i = 0; i < count; ++i) {
      const int gpu = gpu_of(candidates[i].device);
      if (!is_mig_device(candidates[i].device) || gpu_uuid != spec.devices[gpu].uuid) continue;
      const MigState& mig = machine().lock_mig(gpu);
      const MigGpuInstance& instance = mig.instances[gi_slot_of(candidates[i].device)];
      char uuid[48];
      format_mig_uuid(gpu, instance, static_cast<int>(ci_id), uuid, sizeof uuid);
      const bool named = instance.used != 0 && instance.id == gi_id && ci_id < kMigSlots &&
                         instance.compute[ci_id].used != 0 &&
                         std::strcmp(uuid, candidates[i].spec.uuid) == 0;
      machine().unlock_mig();
      if (named) return i;
    }
    return -1;
  }
  char* number_end = nullptr;
  const long index = std::strtol(item, &number_end, 10);
  if (number_end == item || *number_end != '\0' || index < 0 || index >= count) return -1;
  return static_cast<int>(index);
}

// Visible devices: CUDA_VISIBLE_DEVICES lists ordinals or UUIDs (or prefixes); the list ends
// at the first entry that names no device, or one already listed, as with the real driver.
int parse_visible_devices(int* machine_index, DeviceSpec* visible) {
  Candidate candidates[kMostDevices * kMigSlots];
  const int count = enumerate_devices(candidates, kMostDevices * kMigSlots);
  const char* list = std::getenv("CUDA_VISIBLE_DEVICES");
  int shown = 0;
  if (list == nullptr) {
    for (; shown < count && shown < kMostDevices; ++shown) {
      machine_index[shown] = candidates[shown].device;
      visible[shown] = candidates[shown].spec;
    }
    return shown;
  }
  for (const char* cursor = list; *cursor != '\0' && shown < kMostDevices;) {
    const char* end = std::strchr(cursor, ',');
    const std::size_t length = end ? static_cast<std::size_t>(end - cursor) : std::strlen(cursor);
    char item[96] = {};
    if (length >= sizeof item) break;
    std::memcpy(item, cursor, length);
    const int found = find_candidate(item, candidates, count);
    if (found < 0) break;
    bool repeated = false;
    for (int i = 0; i < shown; ++i) repeated |= machine_index[i] == candidates[found].device;
    if (repeated) break;
    machine_index[shown] = candidates[found].device;
    visible[shown++] = candidates[found].spec;
    if (end == nullptr) break;
    cursor = end + 1;
  }
  return shown;
}

}  // namespace

std::uint64_t round_up(std::uint64_t value, std::uint64_t unit) {
  return (value + unit - 1) / unit * unit;
}

thread_local Context* current_context = nullptr;

thread_local Context* context_stack[16];

thread_local int context_depth = 0;

Driver& driver() {
  pthread_once(&driver_once, construct_driver);
  return driver_storage.get();
}

CUresult require_initialized() {
  return driver().initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult require_context(Context*& context) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  context = current_context;
  return context != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult machine_device(CUdevice ordinal, int& index) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (ordinal < 0 || ordinal >= driver().device_count) return CUDA_ERROR_INVALID_DEVICE;
  index = driver().machine_index[ordinal];
  return CUDA_SUCCESS;
}

const DeviceSpec& spec_of(int device) {
  const Driver& state = driver();
  for (int ordinal = 0; ordinal < state.device_count; ++ordinal) {
    if (state.machine_index[ordinal] == device) return state.visible[ordinal];
  }
  return machine().spec().devices[gpu_of(device)];
}

}  // namespace tessera::sim

using namespace tessera::sim;

// --- initialisation and devices ----------------------------------------------------------

SIM_EXPORT CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& state = driver();
  tessera::ErrorText error;
  if (!machine().attach(error)) {
    tessera::log(LogLevel::error, "simgpu", "%s", error.text);
    return CUDA_ERROR_NO_DEVICE;
  }
  Lock locked;
  if (!state.initialized) {
    state.device_count = parse_visible_devices(state.machine_index, state.visible);
    if (CUresult attached = attach_mps(state.mps); attached != CUDA_SUCCESS) return attached;
    if (state.mps.fd >= 0) {
      machine().join_mps_server(
          state.mps.limits.server,
          static_cast<std::uint32_t>(state.mps.limits.thread_percentage * 10 + 0.5));
    }
    state.initialized = true;
  }
  return state.device_count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

SIM_EXPORT CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetCount(int* count) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = driver().device_count;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetName(char* name, int length, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (name == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<std::size_t>(length), "%s", spec_of(index).name);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" -> 16 bytes
  const char* text = spec_of(index).uuid + 4;
  int byte = 0;
  for (const char* p = text; *p != '\0' && byte < 16; ++p) {
    if (*p == '-') continue;
    char pair[3] = {p[0], p[1] ? p[1] : '0', '\0'};
    uuid->bytes[byte++] = static_cast<char>(std::strtol(pair, nullptr, 16));
    if (p[1] == '\0') break;
    ++p;
  }
  while (byte < 16) uuid->bytes[byte++] = 0;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice ordinal) {
  return cuDeviceGetUuid_v2(uuid, ordinal);
}

SIM_EXPORT CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = spec_of(index).memory_bytes;
  return CUDA_SUCCESS;
}

// What an H100 SXM answers to cuDeviceGetAttribute (CUDA 12), by attribute number; the
// device's own spec overrides SMs, compute capability and PCI location. Attributes not
// listed (128, 130, 131 and those past 132) get CUDA_ERROR_INVALID_VALUE, as from a driver
// that predates them.
struct AttributeValue {
  int attribute, value;
};
constexpr AttributeValue kH100Attributes[] = {
    {1, 1024},        {2, 1024},    {3, 1024},       {4, 64},          {5, 2147483647},
    {6, 65535},       {7, 65535},   {8, 49152},      {9, 65536},       {10, 32},
    {11, 2147483647}, {12, 65536},  {13, 1980000},   {14, 512},        {15, 1},
    {17, 0},          {18, 0},      {19, 1},         {20, 0},          {21, 131072},
    {22, 131072},     {23, 65536},  {24, 16384},     {25, 16384},      {26, 16384},
    {27, 32768},      {28, 32768},  {29, 2048},      {30, 512},        {31, 1},
    {32, 1},          {34, 0},      {35, 0},         {36, 2619000},    {37, 5120},
    {38, 52428800},   {39, 2048},   {40, 3},         {41, 1},          {42, 32768},
    {43, 2048},       {44, 0},      {45, 32768},     {46, 32768},      {47, 8192},
    {48, 8192},       {49, 32768},  {51, 32},        {52, 32768},      {53, 32768},
    {54, 2046},       {55, 32768},  {56, 131072},    {57, 65536},      {58, 16384},
    {59, 16384},      {60, 16384},  {61, 32768},     {62, 2048},       {63, 32768},
    {64, 32768},      {65, 2048},   {66, 32768},     {67, 32768},      {68, 2046},
    {69, 268435456},  {70, 131072}, {71, 65000},     {72, 2097120},    {73, 32768},
    {74, 32768},      {77, 32768},  {78, 1},         {79, 1},          {80, 1},
    {81, 233472},     {82, 65536},  {83, 1},         {84, 0},          {85, 0},
    {86, 0},          {87, 2},      {88, 0},         {89, 1},          {90, 1},
    {91, 1},          {92, 1},      {93, 1},         {94, 1},          {95, 1},
    {96, 1},          {97, 232448}, {98, 0},         {99, 1},          {100, 0},
    {101, 0},         {102, 1},     {103, 1},        {104, 0},         {105, 0},
    {106, 32},        {107, 1},     {108, 33554432}, {109, 134213632}, {110, 1},
    {111, 1024},      {112, 1},     {113, 1},        {114, 1},         {115, 1},
    {116, 1},         {117, 1},     {118, 100},      {119, 1},         {120, 1},
    {121, 1},         {122, 1},     {123, 1},        {124, 1},         {125, 1},
    {126, 4},         {127, 1},     {129, 0},        {132, 0},
};

SIM_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const DeviceSpec& spec = spec_of(index);
  unsigned domain = 0, bus = 0, device = 0;
  std::sscanf(spec.pci_bus_id, "%x:%x:%x", &domain, &bus, &device);
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = spec.sm_count;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = spec.cc_major;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = spec.cc_minor;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *value = static_cast<int>(bus);
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      *value = static_cast<int>(domain);
      return CUDA_SUCCESS;
    default:
      for (const AttributeValue& known : kH100Attributes) {
        if (known.attribute == attribute) {
          *value = known.value;
          return CUDA_SUCCESS;
        }
      }
      return CUDA_ERROR_INVALID_VALUE;
  }
}

SIM_EXPORT CUresult cuDeviceGetPCIBusId(char* bus_id, int length, CUdevice ordinal) {
  int index = 0;
  if (CUresult status = machine_device(ordinal, index); status != CUDA_SUCCESS) return status;
  if (bus_id == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(bus_id, static_cast<std::size_t>(length), "%s", spec_of(index).pci_bus_id);
  return CUDA_SUCCESS;
}

// --- errors
// ---------------------------------------------------------------------------------------

namespace {
struct ErrorName {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorName kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
const ErrorName* find_error(CUresult code) {
  for (const ErrorName& error : kErrors) {
    if (error.code == code) return &error;
  }
  return nullptr;
}
}  // namespace

SIM_EXPORT CUresult cuGetErrorName(CUresult code, const char** name) {
  const ErrorName* error = find_error(code);
  if (name == nullptr || error == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = error->name;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuGetErrorString(CUresult code, const char** text) {
  const ErrorName* error = find_error(code);
  if (text == nullptr || error == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *text = error->text;
  return CUDA_SUCCESS;
}

#include "simgpu/sim_proc_address.inc"
