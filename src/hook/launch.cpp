// Compute share: every path into the device's time (kernels, Ex, cooperative, graphs, and
// their per-thread-stream forms) is paced against the group's share, kept as one clock per
// device in the ledger that all members advance (Ledger::pace). What a launch costs is
// learned from CUDA events recorded on its stream just before and just after it: device time
// only, never mixed with the host's clock. Other processes' work queued in between can only
// lengthen that, so the estimate is the least of the recent observations. Until a kernel has been
// seen once its first launch is waited for, and no stream has more than kInFlight launches
// unmeasured, so no burst of unpriced work can run ahead of the share. With no share and no
// priority configured each launch forwards at once.
//
// Priority: a high-priority group records in the device's coordination file (ledger/demand.h),
// which every group on the device shares whatever process, container or pod it is in, when the
// work it has queued there should be done, and the idle gaps it leaves; a low-priority launch
// waits until then.
// A device runs the work queued on it in order and cannot take back a running kernel, so
// low-priority work on the device when high-priority work arrives delays it: while
// high-priority work was pending lately, every low-priority launch is reserved on one
// low-priority timeline per device, shared by all low-priority groups, either in a short queue
// (a quarter of the high groups' tolerance) or in a gap it fits, and must reach the device before
// its gap no longer holds it (docs/compute.md). While a low-priority group's coordination file
// cannot be used, its launches wait: it never runs as if no one had priority over it.
#include <sys/prctl.h>
#include <time.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "hook/hook.h"

using namespace tessera::abi;
using namespace tessera::hook;

namespace tessera::hook {
namespace {

constexpr int kInFlight = 64;
constexpr int kSamples = 16;
constexpr std::uint64_t kLeadNs = 2'000'000;  // how far a group may run ahead of its share
constexpr std::uint64_t kOthersWindowNs =
    20'000'000;  // another group launched this recently: it wants the device
// High-priority work pending this recently: low-priority groups keep their queues short,
constexpr std::uint64_t kHighRecentNs = 100'000'000;
// at most this fraction of a high-priority launch's device time.
constexpr std::uint64_t kHighDelayDivisor = 40;
// How often a long low-priority launch held back looks for a gap to fit.
constexpr std::uint64_t kGapLookNs = 100'000;
// A launch held back this long, priced only beside high-priority work, goes at the start of a
// gap, and its price is measured again.
constexpr std::uint64_t kRepriceAfterNs = 1'000'000'000;
// How often a low-priority launch looks again for a coordination file it cannot use.
constexpr std::uint64_t kUnusableWaitNs = 100'000'000;

struct Cost {
  std::uint64_t samples[kSamples];
  std::uint64_t host_spans[kSamples];  // how long the host held each sample's launch
  int count;
  int next;
  int clean;  // 1 once a sample was taken with no high-priority work and no host delay in it
  std::uint64_t estimate() const {
    std::uint64_t least = 0;
    for (int i = 0; i < count; ++i) least = (i == 0 || samples[i] < least) ? samples[i] : least;
    return least;
  }
  // The least the kernel may take if the host held its launches back (a first launch often
  // loads the module or uploads the graph) while the device waited: at most the estimate.
  std::uint64_t least_possible() const {
    std::uint64_t least = estimate();
    for (int i = 0; i < count; ++i) {
      const std::uint64_t possible = samples[i] > host_spans[i] ? samples[i] - host_spans[i] : 0;
      if (possible < least) least = possible;
    }
    return least;
  }
  void add(std::uint64_t duration, std::uint64_t host_span, bool clean_sample) {
    samples[next] = duration;
    host_spans[next] = host_span;
    next = (next + 1) % kSamples;
    if (count < kSamples) ++count;
    if (clean_sample) clean = 1;
  }
};

struct Pending {
  CUevent before, after;
  std::uint64_t key;
  int device;
  // When high-priority work on the device was to be done, as the launch saw it; kNotClean if
  // it was still pending then.
  std::uint64_t high_until;
  // Host time from recording `before` to the launch's return: the device may have waited for
  // the launch that long, and the sample holds it.
  std::uint64_t host_span_ns;
};
constexpr std::uint64_t kNotClean = UINT64_MAX;

// Guards what launches learn and measure. Taken before coordination_lock (measuring a launch
// reads its device's coordination file), never while waiting for a launch's turn.
constinit Mutex compute_lock ACQUIRED_BEFORE(coordination_lock);

// A stream's governed launches still being measured, and events to reuse.
struct Track {
  Pending pending[kInFlight] GUARDED_BY(compute_lock);
  int head GUARDED_BY(compute_lock), count GUARDED_BY(compute_lock);
  CUevent spare[2 * kInFlight] GUARDED_BY(compute_lock);
  int spares GUARDED_BY(compute_lock);
};

struct ComputeState {
  HandleTable<Cost> costs GUARDED_BY(compute_lock);  // by launch key
  HandleTable<Track*> tracks
      GUARDED_BY(compute_lock);  // by stream (or context, for the default stream)
};

ComputeState* compute_state = nullptr;
pthread_once_t compute_once = PTHREAD_ONCE_INIT;

void reset_compute_after_fork() {  // the child has none of the parent's streams
  compute_lock.reset_after_fork();
  MutexLock locked(compute_lock);
  compute_state->tracks.clear();
}

void create_compute_state() {
  void* memory = std::calloc(1, sizeof(ComputeState));
  compute_state = new (memory) ComputeState();  // never destroyed: see common/immortal.h
  pthread_atfork(nullptr, nullptr, reset_compute_after_fork);
}

ComputeState& compute() {
  pthread_once(&compute_once, create_compute_state);
  return *compute_state;
}

Track* track_for(CUstream stream) REQUIRES(compute_lock) {
  CUcontext context = nullptr;
  hook().real.cuCtxGetCurrent(&context);
  const std::uint64_t key = stream != nullptr ? reinterpret_cast<std::uint64_t>(stream)
                                              : reinterpret_cast<std::uint64_t>(context) | 1;
  if (Track** found = compute().tracks.find(key)) return *found;
  auto* track = static_cast<Track*>(std::calloc(1, sizeof(Track)));
  if (track != nullptr) compute().tracks.put(key, track);
  return track;
}

CUevent take_event(Track& track) REQUIRES(compute_lock) {
  if (track.spares > 0) return track.spare[--track.spares];
  CUevent event = nullptr;
  return hook().real.cuEventCreate(&event, 0) == CUDA_SUCCESS ? event : nullptr;
}

// Measures finished launches (and, if `wait`, waits for the oldest first).
void collect(Track& track, bool wait) REQUIRES(compute_lock) {
  Hook& state = hook();
  while (track.count > 0) {
    Pending& entry = track.pending[track.head];
    const CUresult status =
        wait ? state.real.cuEventSynchronize(entry.after) : state.real.cuEventQuery(entry.after);
    wait = false;
    if (status != CUDA_SUCCESS) break;
    float milliseconds = 0;
    if (state.real.cuEventElapsedTime(&milliseconds, entry.before, entry.after) == CUDA_SUCCESS &&
        milliseconds > 0) {
      Cost cost{};
      if (Cost* known = compute().costs.find(entry.key)) cost = *known;
      // The kernel's own time: no high-priority work was pending at the launch or launched
      // since, and the host did not hold the launch back long (a thread kept off the CPU).
      const auto sample = static_cast<std::uint64_t>(static_cast<double>(milliseconds) * 1e6);
      const ledger::Demand* demand =
          entry.high_until != kNotClean ? coordination(entry.device) : nullptr;
      const bool clean = demand != nullptr && entry.host_span_ns <= sample / 8 &&
                         demand->high_work_until(monotonic_ns()) == entry.high_until;
      cost.add(sample, entry.host_span_ns, clean);
      compute().costs.put(entry.key, cost);
    }
    track.spare[track.spares++] = entry.before;
    track.spare[track.spares++] = entry.after;
    track.head = (track.head + 1) % kInFlight;
    --track.count;
  }
}

// The device time of the launches still being measured on the stream, at their prices.
std::uint64_t in_flight(const Track& track) REQUIRES(compute_lock) {
  std::uint64_t total = 0;
  for (int i = 0; i < track.count; ++i) {
    const Cost* cost = compute().costs.find(track.pending[(track.head + i) % kInFlight].key);
    total += cost != nullptr ? cost->estimate() : kLeadNs;
  }
  return total;
}

// A low-priority group's waits while high-priority work is about are short, and the device
// may run dry until they end: the thread's timer slack (50 us by default) is 1 us for them,
// and put back after.
void wait_closely_until_ns(std::uint64_t when_ns) {
  const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0);
  sleep_until_ns(when_ns);
  if (slack > 0) prctl(PR_SET_TIMERSLACK, slack, 0, 0, 0);
}

// How much low-priority work (all low-priority groups' together) may be queued on device while
// high-priority work is about: a quarter of what the high-priority groups tolerate, since a low
// launch of each group decided just before a high one can still reach the device first.
std::uint64_t low_queue_allowed(const ledger::Demand& demand) {
  return demand.high_launch_cost() * demand.high_tolerance_percent() / 400;
}

// How far ahead of its share a low-priority group may queue: while high-priority work was
// pending lately, a fortieth of its latest launch.
std::uint64_t low_lead(const ledger::Demand& demand) {
  const std::uint64_t now = monotonic_ns(), until = demand.high_work_until(now);
  if (until == 0 || until + kHighRecentNs < now) return kLeadNs;
  const std::uint64_t high_cost = demand.high_launch_cost();
  return high_cost / kHighDelayDivisor < kLeadNs ? high_cost / kHighDelayDivisor : kLeadNs;
}

// Waits while high-priority work is pending on device, and then reserves the launch on the
// low-priority timeline (a short queue, or a gap in high-priority demand it fits), waiting
// while it fits neither; with no high-priority work lately, it goes at once. Returns by when
// the launch must reach the device.
std::uint64_t yield_to_high_priority(Hook& state, int device, ledger::Demand& demand,
                                     const Cost& cost) {
  // A price with no clean sample may hold the host's time: placed at the least the kernel may
  // take, and priced again by that launch (too long, it delays high-priority work once).
  const std::uint64_t price = cost.clean != 0 ? cost.estimate() : cost.least_possible();
  std::uint64_t now = monotonic_ns(), waited = 0, launch_by = UINT64_MAX;
  for (;;) {
    const std::uint64_t until = demand.high_work_until(now);
    std::uint64_t wake = until;
    if (until <= now) {
      if (until == 0 || until + kHighRecentNs < now) break;  // idle lately: no one to protect
      if (price == 0) break;  // unpriced: waited for and priced at once
      const ledger::Demand::LowPlacement placement =
          demand.place_low_work(now, until, price, low_queue_allowed(demand));
      if (placement.placed) {
        launch_by = placement.launch_by;
        break;
      }
      // A price taken only beside high-priority work can hold its time (a kernel queued just
      // as high-priority work took the device), or the host's (a launch kept off the CPU);
      // held back a second, such a launch goes at the start of a gap to be priced again, not
      // wait for a gap it may never have needed. A price taken once clean is the kernel's own.
      if (cost.clean == 0 && waited >= kRepriceAfterNs && now <= until + kGapLookNs) break;
      // Looked at again once the low-priority queue has room, or high-priority work may have
      // come (a new gap then starts) or gone idle for good.
      wake = placement.retry_at != 0 && placement.retry_at < now + kGapLookNs ? placement.retry_at
                                                                              : now + kGapLookNs;
      if (until + kHighRecentNs < wake) wake = until + kHighRecentNs;
    }
    wait_closely_until_ns(wake);  // high-priority work may have come meanwhile: look again
    const std::uint64_t woke = monotonic_ns();
    waited += woke - now;
    now = woke;
  }
  if (waited > 0) state.ledger.add_held(device, waited);
  return launch_by;
}

// Whether the launch goes into a graph being captured rather than onto the device. Such a
// launch takes no device time now (the graph's launch is paced), and must not be measured:
// waiting for an event recorded into a capture breaks the capture
// (CUDA_ERROR_CAPTURED_EVENT, then CUDA_ERROR_STREAM_CAPTURE_INVALIDATED at its end).
bool captured(Hook& state, CUstream stream, bool per_thread) {
  int status = CU_STREAM_CAPTURE_STATUS_NONE;
  const auto query =
      per_thread ? state.real.cuStreamIsCapturing_ptsz : state.real.cuStreamIsCapturing;
  return query != nullptr && query(stream, &status) == CUDA_SUCCESS &&
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

template <typename Launch>
CUresult governed(std::uint64_t key, CUstream stream, bool per_thread, Launch launch) {
  Hook& state = hook();
  const int device = current_device();
  if (device < 0 || device >= kMostDevices) return launch();
  const std::uint32_t share = state.ledger.effective_cores(device);
  if (share == 0 && state.priority == Priority::none) return launch();
  if (captured(state, stream, per_thread)) return launch();
  ledger::Demand* demand = coordination(device);
  if (state.priority == Priority::low) {
    // Without the device's coordination file it cannot know what high-priority work wants.
    while (demand == nullptr) {
      sleep_until_ns(monotonic_ns() + kUnusableWaitNs);
      state.ledger.add_held(device, kUnusableWaitNs);
      demand = coordination(device);
    }
  }
  // While high-priority work is about, what a low-priority stream still has on the device,
  // by the device's own events, must leave room for this launch in the low-priority queue
  // before it is decided whether the launch may go: prices are estimates, and the share's
  // clock counts the group's launches as if it had the device alone.
  auto high_about = [&] {  // for a low-priority group: high-priority work pending lately
    if (state.priority != Priority::low) return false;
    const std::uint64_t now = monotonic_ns(), until = demand->high_work_until(now);
    return until != 0 && until + kHighRecentNs >= now;
  };
  const std::uint64_t backlog_allowed = high_about() ? low_queue_allowed(*demand) : UINT64_MAX;
  ComputeState& shared = compute();
  Track* track = nullptr;
  Cost cost{};
  {
    MutexLock locked(compute_lock);
    track = track_for(stream);
    if (track != nullptr) {
      collect(*track, track->count == kInFlight);
      if (const Cost* known = shared.costs.find(key)) cost = *known;
      // Work longer than the queue holds goes into a gap only once the stream's own is done.
      const std::uint64_t estimate = cost.estimate();
      while (backlog_allowed != UINT64_MAX && track->count > 0 &&
             in_flight(*track) > (estimate > backlog_allowed ? 0 : backlog_allowed)) {
        const int before = track->count;
        collect(*track, true);
        if (track->count == before) break;  // the event failed: the device will say why
      }
    }
  }
  if (track == nullptr) return launch();
  const std::uint64_t estimate = cost.estimate();

  const std::uint64_t lead = state.priority == Priority::low ? low_lead(*demand) : kLeadNs;
  const std::uint64_t now = monotonic_ns();
  if (demand != nullptr) demand->stamp(now);
  // A bursting group takes the whole device while no other group has wanted it lately; the
  // lead still bounds what it has queued, so a newcomer waits at most that long. Without its
  // coordination file it cannot tell, and keeps to its share.
  const bool take_all = share == 0 || (state.burst && demand != nullptr &&
                                       !demand->others_active(now, kOthersWindowNs));
  const std::uint32_t percent = take_all ? 100 : share;
  std::uint64_t launch_at = now;
  if (estimate > 0) {  // wait for the share to have earned it
    const std::uint64_t allowed = state.ledger.pace(device, estimate, now, lead, percent);
    if (allowed > now) {
      sleep_until_ns(allowed);
      state.ledger.add_throttled(device, allowed - now);
      launch_at = allowed;
    }
  }
  // Last, just before the launch: what high-priority work wants now. The host may keep this
  // thread off the CPU past the moment its gap allowed: it is then placed again, from now (its
  // old reservation stays: it only makes others wait a little longer).
  if (state.priority == Priority::low) {
    std::uint64_t launch_by = yield_to_high_priority(state, device, *demand, cost);
    while (monotonic_ns() > launch_by) {
      launch_by = yield_to_high_priority(state, device, *demand, cost);
    }
  }
  // Unpriced work is waited for below; until then it keeps low-priority groups out a lead.
  if (state.priority == Priority::high && demand != nullptr) {
    demand->add_high_work(launch_at, estimate > 0 ? estimate : kLeadNs, state.priority_tolerance);
  }
  // Whether a sample is clean matters only to low-priority groups: others read no clock and
  // no coordination file for it.
  const bool low = state.priority == Priority::low;
  CUevent before = nullptr;
  std::uint64_t recording = 0;
  {
    MutexLock locked(compute_lock);
    before = take_event(*track);
    recording = low ? monotonic_ns() : 0;
    if (before != nullptr && state.real.cuEventRecord(before, stream) != CUDA_SUCCESS) {
      track->spare[track->spares++] = before;
      before = nullptr;
    }
  }
  std::uint64_t high_until = kNotClean;
  if (low) {
    const std::uint64_t launching = monotonic_ns();
    const std::uint64_t until = demand->high_work_until(launching);
    if (until <= launching) high_until = until;
  }
  const CUresult result = launch();
  const std::uint64_t host_span = low ? monotonic_ns() - recording : 0;
  MutexLock locked(compute_lock);
  CUevent after = before != nullptr && result == CUDA_SUCCESS ? take_event(*track) : nullptr;
  if (after != nullptr && state.real.cuEventRecord(after, stream) == CUDA_SUCCESS) {
    TESSERA_DCHECK(track->count < kInFlight);  // collect() made room before the launch
    track->pending[(track->head + track->count) % kInFlight] =
        Pending{before, after, key, device, high_until, host_span};
    ++track->count;
  } else {
    if (before != nullptr) track->spare[track->spares++] = before;
    if (after != nullptr) track->spare[track->spares++] = after;
  }
  if (estimate == 0 &&
      result == CUDA_SUCCESS) {  // an unpriced kernel: learn its cost now, and charge it
    collect(*track, true);
    const Cost* learned = shared.costs.find(key);
    if (learned != nullptr)
      state.ledger.pace(device, learned->estimate(), monotonic_ns(), lead, percent);
  }
  return result;
}

std::uint64_t kernel_key(CUfunction f, unsigned x, unsigned y, unsigned z) {
  return reinterpret_cast<std::uint64_t>(f) ^ (std::uint64_t{x} * y * z * 0x9e3779b97f4a7c15ull);
}

}  // namespace
}  // namespace tessera::hook

#define GRID_ARGUMENTS gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes

#define GOVERNED_LAUNCH(name, params, key, stream, arguments)                          \
  HOOK_EXPORT CUresult name params {                                                   \
    HOOK_ENTER();                                                                      \
    if (__builtin_expect(!state.compute_limited, 1)) return state.real.name arguments; \
    return governed(key, stream, std::string_view(#name).ends_with("_ptsz"),           \
                    [&] { return state.real.name arguments; });                        \
  }

GOVERNED_LAUNCH(cuLaunchKernel,
                (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams,
                 void** extra),
                kernel_key(f, gridDimX, gridDimY, gridDimZ), hStream,
                (f, GRID_ARGUMENTS, hStream, kernelParams, extra))
GOVERNED_LAUNCH(cuLaunchKernel_ptsz,
                (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams,
                 void** extra),
                kernel_key(f, gridDimX, gridDimY, gridDimZ), hStream,
                (f, GRID_ARGUMENTS, hStream, kernelParams, extra))
GOVERNED_LAUNCH(cuLaunchKernelEx,
                (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra),
                config ? kernel_key(f, config->gridDimX, config->gridDimY, config->gridDimZ) : 0,
                config ? config->hStream : nullptr, (config, f, kernelParams, extra))
GOVERNED_LAUNCH(cuLaunchKernelEx_ptsz,
                (const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra),
                config ? kernel_key(f, config->gridDimX, config->gridDimY, config->gridDimZ) : 0,
                config ? config->hStream : nullptr, (config, f, kernelParams, extra))
GOVERNED_LAUNCH(cuLaunchCooperativeKernel,
                (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams),
                kernel_key(f, gridDimX, gridDimY, gridDimZ), hStream,
                (f, GRID_ARGUMENTS, hStream, kernelParams))
GOVERNED_LAUNCH(cuLaunchCooperativeKernel_ptsz,
                (CUfunction f, TESSERA_LAUNCH_GRID_PARAMS, CUstream hStream, void** kernelParams),
                kernel_key(f, gridDimX, gridDimY, gridDimZ), hStream,
                (f, GRID_ARGUMENTS, hStream, kernelParams))
GOVERNED_LAUNCH(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream),
                reinterpret_cast<std::uint64_t>(hGraphExec), hStream, (hGraphExec, hStream))
GOVERNED_LAUNCH(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream),
                reinterpret_cast<std::uint64_t>(hGraphExec), hStream, (hGraphExec, hStream))

// Host functions take no device time: forwarded as they are.
HOOK_EXPORT CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  HOOK_ENTER();
  return state.real.cuLaunchHostFunc(hStream, fn, userData);
}
HOOK_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  HOOK_ENTER();
  return state.real.cuLaunchHostFunc_ptsz(hStream, fn, userData);
}
