// The simulated driver's streams, events, graphs, stream capture and kernel launches, each
// put on the simulated device's timeline.
#include "simgpu/sim_cuda_internal.h"

namespace tessera::sim {

namespace {

Stream* stream_of(CUstream handle, Context* context) {
  // Null, CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2) name the default stream.
  if (reinterpret_cast<std::uintptr_t>(handle) <= 2) return &context->default_stream;
  return reinterpret_cast<Stream*>(handle);
}

// Stream captures in progress in this process, by number: a call the driver forbids during a
// capture invalidates it, and its end then fails, as CUDA's does.
constinit Mutex captures_lock;

struct ActiveCaptures {
  std::uint64_t next GUARDED_BY(captures_lock) = 0;
  Graph* graphs[64] GUARDED_BY(captures_lock) = {};
};

ActiveCaptures captures_in_progress;  // constant-initialised, trivially destroyed
ActiveCaptures& active_captures() {
  return captures_in_progress;
}

// Registers a capture; false when too many are in progress.
bool begin_capture(Graph* graph) {
  ActiveCaptures& captures = active_captures();
  MutexLock locked(captures_lock);
  bool placed = false;
  for (Graph*& slot : captures.graphs) {
    if (slot == nullptr) {
      graph->capture_sequence = ++captures.next;
      slot = graph;
      placed = true;
      break;
    }
  }
  return placed;
}

void end_capture(Graph* graph) {
  ActiveCaptures& captures = active_captures();
  MutexLock locked(captures_lock);
  for (Graph*& slot : captures.graphs) {
    if (slot == graph) slot = nullptr;
  }
}

// The capture numbered `sequence`, if still in progress, is invalidated.
void invalidate_capture(std::uint64_t sequence) {
  ActiveCaptures& captures = active_captures();
  MutexLock locked(captures_lock);
  for (Graph* graph : captures.graphs) {
    if (graph != nullptr && graph->capture_sequence == sequence) {
      __atomic_store_n(&graph->invalidated, true, __ATOMIC_RELAXED);
    }
  }
}

// Waiting for, querying or timing an event recorded into a capture is refused and breaks the
// capture (CUDA_ERROR_CAPTURED_EVENT); success otherwise.
CUresult refuse_captured_event(const Event* event) {
  if (event->captured_sequence == 0) return CUDA_SUCCESS;
  invalidate_capture(event->captured_sequence);
  return CUDA_ERROR_CAPTURED_EVENT;
}

bool append_to_graph(Graph* graph, std::uint64_t duration_ns) {
  if (graph->count == graph->capacity) {
    const int capacity = graph->capacity == 0 ? 16 : graph->capacity * 2;
    auto* grown = static_cast<std::uint64_t*>(
        std::realloc(graph->durations, static_cast<std::size_t>(capacity) * sizeof(std::uint64_t)));
    if (grown == nullptr) return false;
    graph->durations = grown;
    graph->capacity = capacity;
  }
  graph->durations[graph->count++] = duration_ns;
  return true;
}

// Puts work on the device's timeline behind the stream, or into the graph being captured.
// Queues work (or, of no duration, a marker such as an event) on the device after the
// stream's; returns its ticket.
std::uint64_t queue_on_device(Stream* stream, std::uint64_t duration_ns,
                              std::uint32_t sm_permille = 0) {
  Context* context = stream->context;
  stream->last_ticket = machine().submit(context->device, duration_ns, sm_permille);
  std::atomic_ref<std::uint64_t> latest(context->latest_ticket);
  std::uint64_t seen = latest.load();
  while (seen < stream->last_ticket && !latest.compare_exchange_weak(seen, stream->last_ticket)) {
  }
  return stream->last_ticket;
}

// `sm_permille`: of the device's SMs the work spreads over (0: all the process may use).
CUresult submit(Stream* stream, std::uint64_t duration_ns, std::uint32_t sm_permille = 0) {
  if (stream->capture != nullptr) {
    return append_to_graph(stream->capture, duration_ns) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  }
  queue_on_device(stream, duration_ns, sm_permille);
  return CUDA_SUCCESS;
}

// "name@20us" runs 20 microseconds per wave; a name without a duration runs 10 us.
std::uint64_t duration_from_name(const char* name) {
  const char* at = std::strrchr(name, '@');
  if (at == nullptr) return 10000;
  char* unit = nullptr;
  const double value = std::strtod(at + 1, &unit);
  if (unit == at + 1 || value <= 0) return 10000;
  double scale = 1000;  // us
  if (std::strcmp(unit, "ns") == 0) scale = 1;
  if (std::strcmp(unit, "ms") == 0) scale = 1e6;
  if (std::strcmp(unit, "s") == 0) scale = 1e9;
  return static_cast<std::uint64_t>(value * scale);
}

CUresult launch(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                unsigned block_y, unsigned block_z, CUstream handle) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (grid_x == 0 || grid_y == 0 || grid_z == 0 || block_x == 0 || block_y == 0 || block_z == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const MpsClient& mps = driver().mps;
  if (mps_daemon_gone(mps)) return CUDA_ERROR_MPS_RPC_FAILURE;
  // A wave is one block per SM: a grid larger than the device takes several. An MPS client
  // has only its active thread percentage of the SMs.
  const std::uint64_t blocks = std::uint64_t{grid_x} * grid_y * grid_z;
  auto sms = static_cast<std::uint64_t>(spec_of(context->device).sm_count);
  if (mps.fd >= 0) {
    const auto share =
        static_cast<std::uint64_t>(static_cast<double>(sms) * mps.limits.thread_percentage / 100.0);
    sms = share > 0 ? share : 1;
  }
  const std::uint64_t waves = (blocks + sms - 1) / sms;
  // A grid smaller than its SMs leaves the rest to other MPS clients' kernels.
  const std::uint64_t device_sms = static_cast<std::uint64_t>(spec_of(context->device).sm_count);
  const auto used_permille = static_cast<std::uint32_t>(
      std::max<std::uint64_t>(1, std::min(blocks, sms) * 1000 / device_sms));
  return submit(stream_of(handle, context), reinterpret_cast<Function*>(f)->duration_ns * waves,
                mps.fd >= 0 ? used_permille : 0);
}

// Blocks until the stream's work is done; refused while it is being captured.
CUresult synchronize_stream(CUstream handle) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  Stream* stream = stream_of(handle, context);
  if (stream->capture != nullptr) {
    __atomic_store_n(&stream->capture->invalidated, true, __ATOMIC_RELAXED);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  machine().wait(context->device, stream->last_ticket);
  release_pools_on_sync();
  return CUDA_SUCCESS;
}

}  // namespace

}  // namespace tessera::sim

using namespace tessera::sim;

// --- streams and events ------------------------------------------------------------------------

SIM_EXPORT CUresult cuStreamCreate(CUstream* handle, unsigned int) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* stream = static_cast<Stream*>(std::calloc(1, sizeof(Stream)));
  if (stream == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  stream->context = context;
  *handle = reinterpret_cast<CUstream>(stream);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (reinterpret_cast<std::uintptr_t>(handle) <= 2) return CUDA_ERROR_INVALID_HANDLE;
  std::free(handle);  // queued work still completes: it is on the device's timeline
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamSynchronize(CUstream handle) {
  return synchronize_stream(handle);
}
SIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream handle) {
  return synchronize_stream(handle);
}
SIM_EXPORT CUresult cuStreamQuery(CUstream handle) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  return machine().done(context->device, stream_of(handle, context)->last_ticket, nullptr)
             ? CUDA_SUCCESS
             : CUDA_ERROR_NOT_READY;
}
SIM_EXPORT CUresult cuStreamWaitEvent(CUstream handle, CUevent handle_event, unsigned int) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  auto* event = reinterpret_cast<Event*>(handle_event);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Stream* stream = stream_of(handle, context);
  // A process's work runs in submission order: waiting for the event is running after it.
  if (event->recorded && event->ticket > stream->last_ticket) stream->last_ticket = event->ticket;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream handle, int) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  Stream* stream = stream_of(handle, context);
  if (stream == &context->default_stream) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (stream->capture != nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* graph = static_cast<Graph*>(std::calloc(1, sizeof(Graph)));
  if (graph == nullptr || !begin_capture(graph)) {
    std::free(graph);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  stream->capture = graph;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamEndCapture(CUstream handle, CUgraph* graph) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  Stream* stream = stream_of(handle, context);
  if (graph == nullptr || stream->capture == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* captured = stream->capture;
  stream->capture = nullptr;
  end_capture(captured);
  if (__atomic_load_n(&captured->invalidated, __ATOMIC_RELAXED)) {
    std::free(captured->durations);
    std::free(captured);
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  captured->capture_sequence = 0;
  *graph = reinterpret_cast<CUgraph>(captured);
  return CUDA_SUCCESS;
}
CUresult capture_status(CUstream handle, int* status) {
  Context* context = nullptr;
  if (CUresult result = require_context(context); result != CUDA_SUCCESS) return result;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Graph* capture = stream_of(handle, context)->capture;
  *status = capture == nullptr ? CU_STREAM_CAPTURE_STATUS_NONE
            : __atomic_load_n(&capture->invalidated, __ATOMIC_RELAXED)
                ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamIsCapturing(CUstream handle, int* status) {
  return capture_status(handle, status);
}
SIM_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream handle, int* status) {
  return capture_status(handle, status);
}
SIM_EXPORT CUresult cuEventCreate(CUevent* handle, unsigned int) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *handle = static_cast<CUevent>(std::calloc(1, sizeof(Event)));
  return *handle ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
// An event is a marker on its stream that the device reaches in the process's turn, after
// the process's earlier work: a process holding the device in its time slice delays
// another's events too.
SIM_EXPORT CUresult cuEventRecord(CUevent handle, CUstream handle_stream) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  auto* event = reinterpret_cast<Event*>(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Stream* stream = stream_of(handle_stream, context);
  event->device = context->device;
  event->recorded = true;
  if (stream->capture != nullptr) {  // a node of the graph being captured
    event->captured_sequence = stream->capture->capture_sequence;
    return CUDA_SUCCESS;
  }
  event->captured_sequence = 0;
  event->recorded_ns = monotonic_ns();
  event->ticket = queue_on_device(stream, 0);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuEventQuery(CUevent handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  auto* event = reinterpret_cast<Event*>(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult refused = refuse_captured_event(event); refused != CUDA_SUCCESS) return refused;
  if (!event->recorded) return CUDA_SUCCESS;
  return machine().done(event->device, event->ticket, nullptr) ? CUDA_SUCCESS
                                                               : CUDA_ERROR_NOT_READY;
}
SIM_EXPORT CUresult cuEventSynchronize(CUevent handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  auto* event = reinterpret_cast<Event*>(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult refused = refuse_captured_event(event); refused != CUDA_SUCCESS) return refused;
  if (event->recorded) machine().wait(event->device, event->ticket);
  release_pools_on_sync();
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuEventElapsedTime(float* milliseconds, CUevent start, CUevent end) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  auto* first = reinterpret_cast<Event*>(start);
  auto* second = reinterpret_cast<Event*>(end);
  if (milliseconds == nullptr || first == nullptr || second == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!first->recorded || !second->recorded) return CUDA_ERROR_INVALID_HANDLE;
  for (const Event* event : {first, second}) {
    if (CUresult refused = refuse_captured_event(event); refused != CUDA_SUCCESS) return refused;
  }
  std::uint64_t times[2];
  for (int i = 0; i < 2; ++i) {
    const Event* event = i == 0 ? first : second;
    std::uint64_t ended = 0;
    if (!machine().done(event->device, event->ticket, &ended)) return CUDA_ERROR_NOT_READY;
    times[i] = ended > event->recorded_ns ? ended : event->recorded_ns;
  }
  *milliseconds =
      static_cast<float>((static_cast<double>(times[1]) - static_cast<double>(times[0])) / 1e6);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuEventDestroy_v2(CUevent handle) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (handle == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::free(handle);
  return CUDA_SUCCESS;
}

// --- modules and launches ------------------------------------------------------------------------

SIM_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *module = static_cast<CUmodule>(std::malloc(16));
  return *module ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
SIM_EXPORT CUresult cuModuleGetFunction(CUfunction* handle, CUmodule module, const char* name) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (handle == nullptr || module == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* function = static_cast<Function*>(std::calloc(1, sizeof(Function)));
  if (function == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::snprintf(function->name, sizeof function->name, "%s", name);
  function->duration_ns = duration_from_name(name);
  *handle = reinterpret_cast<CUfunction>(function);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuModuleUnload(CUmodule module) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::free(module);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned, CUstream stream, void**,
                                   void**) {
  return launch(f, gx, gy, gz, bx, by, bz, stream);
}
SIM_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, unsigned,
                                        CUstream stream, void**, void**) {
  return launch(f, gx, gy, gz, bx, by, bz, stream);
}
SIM_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void**, void**) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                config->blockDimY, config->blockDimZ, config->hStream);
}
SIM_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** p,
                                          void** e) {
  return cuLaunchKernelEx(config, f, p, e);
}
SIM_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                              unsigned bx, unsigned by, unsigned bz, unsigned,
                                              CUstream stream, void**) {
  return launch(f, gx, gy, gz, bx, by, bz, stream);
}
SIM_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                   unsigned gz, unsigned bx, unsigned by,
                                                   unsigned bz, unsigned, CUstream stream, void**) {
  return launch(f, gx, gy, gz, bx, by, bz, stream);
}
// Runs when the stream reaches it; the caller waits until then.
SIM_EXPORT CUresult cuLaunchHostFunc(CUstream handle, CUhostFn fn, void* user_data) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* stream = stream_of(handle, context);
  if (stream->capture != nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  machine().wait(context->device, stream->last_ticket);
  fn(user_data);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void* user_data) {
  return cuLaunchHostFunc(stream, fn, user_data);
}
SIM_EXPORT CUresult cuGraphCreate(CUgraph* graph, unsigned int flags) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  if (graph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *graph = static_cast<CUgraph>(std::calloc(1, sizeof(Graph)));
  return *graph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph handle,
                                                unsigned long long) {
  if (CUresult status = require_initialized(); status != CUDA_SUCCESS) return status;
  auto* graph = reinterpret_cast<Graph*>(handle);
  if (exec == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* copy = static_cast<Graph*>(std::calloc(1, sizeof(Graph)));
  if (copy == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  for (int i = 0; i < graph->count; ++i) append_to_graph(copy, graph->durations[i]);
  *exec = reinterpret_cast<CUgraphExec>(copy);
  return CUDA_SUCCESS;
}
// A graph's kernels run one after another on the stream, as separate pieces of device work.
SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec handle, CUstream stream_handle) {
  Context* context = nullptr;
  if (CUresult status = require_context(context); status != CUDA_SUCCESS) return status;
  auto* graph = reinterpret_cast<Graph*>(handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* stream = stream_of(stream_handle, context);
  for (int i = 0; i < graph->count; ++i) {
    if (CUresult status = submit(stream, graph->durations[i]); status != CUDA_SUCCESS) {
      return status;
    }
  }
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  return cuGraphLaunch(exec, stream);
}
SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec handle) {
  auto* graph = reinterpret_cast<Graph*>(handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::free(graph->durations);
  std::free(graph);
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuGraphDestroy(CUgraph handle) {
  return cuGraphExecDestroy(reinterpret_cast<CUgraphExec>(handle));
}
