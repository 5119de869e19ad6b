// The simulated GPU behaves as the driver does on the paths Tessera depends on: if it did
// not, passing the hook tests on it would mean nothing.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <cstring>

#include "cuda_abi/cuda_abi.h"
#include "simgpu/sim_machine.h"
#include "support.h"

namespace tessera::test {
namespace {

using namespace tessera::abi;

// The simulated driver loaded into this test process, on a private machine of two devices.
class SimulatedDriver : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new ScratchDirectory;
    setenv("TESSERA_SIM_STATE", scratch_->file("simgpu").c_str(), 1);
    setenv("TESSERA_SIM_DEVICES", "H100;A100", 1);
    library_ = dlopen(build_path("sim/libcuda.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library_, nullptr) << dlerror();
  }
  static void TearDownTestSuite() { delete scratch_; }

  template <typename Function>
  static Function get(const char* name) {
    auto* function = reinterpret_cast<Function>(dlsym(library_, name));
    EXPECT_NE(function, nullptr) << name;
    return function;
  }

  static void* library_;
  static ScratchDirectory* scratch_;
};
void* SimulatedDriver::library_ = nullptr;
ScratchDirectory* SimulatedDriver::scratch_ = nullptr;

TEST_F(SimulatedDriver, ProcAddressFollowsVersionsFlagsAndStatuses) {
  auto init = get<PFN_cuInit>("cuInit");
  auto proc = get<PFN_cuGetProcAddress_v2>("cuGetProcAddress_v2");
  ASSERT_EQ(init(0), CUDA_SUCCESS);
  void* found = nullptr;
  CUdriverProcAddressQueryResult status = -1;

  ASSERT_EQ(proc("cuMemAlloc", &found, 12000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(found, dlsym(library_, "cuMemAlloc_v2"));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);

  ASSERT_EQ(proc("cuCtxCreate", &found, 11040, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(found, dlsym(library_, "cuCtxCreate_v3"));  // the variant of the asked version
  ASSERT_EQ(proc("cuCtxCreate", &found, 12080, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(found, dlsym(library_, "cuCtxCreate_v4"));

  ASSERT_EQ(
      proc("cuLaunchKernel", &found, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status),
      CUDA_SUCCESS);
  EXPECT_EQ(found, dlsym(library_, "cuLaunchKernel_ptsz"));
  ASSERT_EQ(proc("cuLaunchKernel", &found, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status),
            CUDA_SUCCESS);
  EXPECT_EQ(found, dlsym(library_, "cuLaunchKernel"));

  ASSERT_EQ(proc("cuNoSuchThing", &found, 12000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(found, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  ASSERT_EQ(proc("cuMemAllocAsync", &found, 11000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(found, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(proc("cuMemAlloc", &found, 99000, 0, &status), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(SimulatedDriver, DeviceAttributesAreAnH100sWithTheDevicesOwnShape) {
  auto init = get<PFN_cuInit>("cuInit");
  auto attribute = get<CUresult (*)(int*, int, CUdevice)>("cuDeviceGetAttribute");
  ASSERT_EQ(init(0), CUDA_SUCCESS);
  int value = -1;
  // Every attribute a CUDA 12 H100 answers, 1 to 127, is answered (none is left at -1).
  for (int number = 1; number <= 127; ++number) {
    if (number == 16 || number == 75 || number == 76) continue;  // the spec's, below
    value = -1;
    EXPECT_EQ(attribute(&value, number, 0), CUDA_SUCCESS) << "attribute " << number;
    EXPECT_GE(value, 0) << "attribute " << number;
  }
  const struct {
    int attribute, device, expected;
  } answers[] = {
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 0, 2048},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0, 1024},
      {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0, 32},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0, 232448},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 0, 32},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0, 132},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 1, 108},  // the A100
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 1, 8},
      {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0, 0x10},
      {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1, 0x11},
      {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 1, 0},
  };
  for (const auto& answer : answers) {
    ASSERT_EQ(attribute(&value, answer.attribute, answer.device), CUDA_SUCCESS);
    EXPECT_EQ(value, answer.expected) << "attribute " << answer.attribute;
  }
  EXPECT_EQ(attribute(&value, 128, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(attribute(&value, 100000, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(attribute(nullptr, 1, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(attribute(&value, 1, 7), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(SimulatedDriver, CallsNeedInitialisationAndAContext) {
  auto alloc = get<PFN_cuMemAlloc_v2>("cuMemAlloc_v2");
  auto init = get<PFN_cuInit>("cuInit");
  ASSERT_EQ(init(0), CUDA_SUCCESS);
  CUdeviceptr pointer = 0;
  EXPECT_EQ(alloc(&pointer, 1024), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(init(1), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(SimulatedDriver, VmmEnforcesGranularityAndLocations) {
  auto init = get<PFN_cuInit>("cuInit");
  auto create = get<PFN_cuMemCreate>("cuMemCreate");
  auto release = get<PFN_cuMemRelease>("cuMemRelease");
  ASSERT_EQ(init(0), CUDA_SUCCESS);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle handle = 0;
  EXPECT_EQ(create(&handle, 3 << 20, &prop, 0), CUDA_ERROR_INVALID_VALUE);  // not 2 MiB-aligned
  ASSERT_EQ(create(&handle, 4 << 20, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(release(handle), CUDA_SUCCESS);
  EXPECT_EQ(release(handle), CUDA_ERROR_INVALID_VALUE);  // already gone
  prop.location.id = 7;
  EXPECT_EQ(create(&handle, 4 << 20, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
}

// As on an H200 (driver 580): waiting for an event recorded into a stream capture is refused
// and breaks the capture, whose end then fails. A hook that measured captured launches with
// events broke every CUDA graph captured under a compute share; the sim must fail it too.
TEST_F(SimulatedDriver, WaitingForACapturedEventBreaksTheCapture) {
  auto init = get<PFN_cuInit>("cuInit");
  auto retain = get<CUresult (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain");
  auto set_current = get<PFN_cuCtxSetCurrent>("cuCtxSetCurrent");
  auto create_stream = get<PFN_cuStreamCreate>("cuStreamCreate");
  auto create_event = get<PFN_cuEventCreate>("cuEventCreate");
  auto record = get<PFN_cuEventRecord>("cuEventRecord");
  auto synchronize = get<PFN_cuEventSynchronize>("cuEventSynchronize");
  auto query = get<PFN_cuEventQuery>("cuEventQuery");
  auto begin = get<PFN_cuStreamBeginCapture_v2>("cuStreamBeginCapture_v2");
  auto end = get<PFN_cuStreamEndCapture>("cuStreamEndCapture");
  auto capturing = get<PFN_cuStreamIsCapturing>("cuStreamIsCapturing");
  auto destroy_graph = get<PFN_cuGraphDestroy>("cuGraphDestroy");
  auto destroy_event = get<PFN_cuEventDestroy_v2>("cuEventDestroy_v2");
  auto destroy_stream = get<PFN_cuStreamDestroy_v2>("cuStreamDestroy_v2");
  ASSERT_EQ(init(0), CUDA_SUCCESS);
  CUcontext context = nullptr;
  ASSERT_EQ(retain(&context, 0), CUDA_SUCCESS);
  ASSERT_EQ(set_current(context), CUDA_SUCCESS);
  CUstream stream = nullptr;
  CUevent event = nullptr;
  ASSERT_EQ(create_stream(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(create_event(&event, 0), CUDA_SUCCESS);
  int status = -1;
  for (const bool touch_event : {false, true}) {
    ASSERT_EQ(begin(stream, 0), CUDA_SUCCESS);
    ASSERT_EQ(capturing(stream, &status), CUDA_SUCCESS);
    EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    ASSERT_EQ(record(event, stream), CUDA_SUCCESS);  // legal: a node of the graph
    if (touch_event) {
      EXPECT_EQ(synchronize(event), CUDA_ERROR_CAPTURED_EVENT);
      ASSERT_EQ(capturing(stream, &status), CUDA_SUCCESS);
      EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    }
    CUgraph graph = reinterpret_cast<CUgraph>(&status);
    EXPECT_EQ(end(stream, &graph),
              touch_event ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS);
    EXPECT_EQ(graph == nullptr, touch_event);
    if (graph != nullptr) {
      EXPECT_EQ(destroy_graph(graph), CUDA_SUCCESS);
    }
    // The event stays a captured one until it is recorded outside a capture again.
    EXPECT_EQ(query(event), CUDA_ERROR_CAPTURED_EVENT);
    ASSERT_EQ(capturing(stream, &status), CUDA_SUCCESS);
    EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  }
  ASSERT_EQ(record(event, stream), CUDA_SUCCESS);
  EXPECT_EQ(synchronize(event), CUDA_SUCCESS);
  EXPECT_EQ(destroy_event(event), CUDA_SUCCESS);
  EXPECT_EQ(destroy_stream(stream), CUDA_SUCCESS);
}

Environment simulated(const ScratchDirectory& scratch, const Environment& extra = {}) {
  Environment settings{{"TESSERA_SIM_DEVICES", kTestDevices}};
  for (const auto& [key, value] : extra) settings[key] = value;
  return unhooked(scratch, settings);
}

TEST(SimulatedMachine, CapacityHoldsAcrossProcessesAndDiesWithThem) {
  ScratchDirectory scratch;
  Running holder({worker(), "hold", std::to_string(50 * kGiB)}, simulated(scratch));
  ASSERT_EQ(holder.read_line(), "result=0");
  const Finished refused =
      run({worker(), "path", "alloc", std::to_string(40 * kGiB)}, simulated(scratch));
  EXPECT_EQ(refused.value("result"), "2");
  holder.kill_hard();
  holder.wait();
  const Finished granted =
      run({worker(), "path", "alloc", std::to_string(40 * kGiB)}, simulated(scratch));
  EXPECT_EQ(granted.value("result"), "0");
}

// Unless told otherwise, a context costs what one does on the real part (a few hundred MiB),
// so a workload on the simulated GPU meets the memory a real one loses to its context.
TEST(SimulatedMachine, APresetsContextCostsWhatARealOneDoes) {
  const struct {
    const char* devices;
    std::uint64_t context_bytes;
  } cases[] = {{"H100", 512 * kMiB},
               {"A100", 416 * kMiB},
               {"T4", 256 * kMiB},
               {"H100,context=100MiB", 100 * kMiB}};
  for (const auto& c : cases) {
    ScratchDirectory scratch;
    const Finished done =
        run({worker(), "info"}, unhooked(scratch, {{"TESSERA_SIM_DEVICES", c.devices}}));
    ASSERT_EQ(done.exit_code, 0) << c.devices << done.err;
    EXPECT_EQ(done.number("total") - done.number("free"), c.context_bytes) << c.devices;
    EXPECT_EQ(done.number("driver_used"), c.context_bytes) << c.devices;  // as NVML lists it
  }
}

TEST(SimulatedMachine, VisibleDevicesSelectAndEndAtTheFirstBadEntry) {
  ScratchDirectory scratch;
  struct Case {
    const char* visible;
    std::uint64_t total;
  } cases[] = {
      {"1", 40536 * kMiB},
      {"GPU-7e55e7a0-0000-4000-8000-000000000001", 40536 * kMiB},
      {"0,1", 81559 * kMiB},
  };
  for (const Case& c : cases) {
    const Finished done =
        run({worker(), "info"}, simulated(scratch, {{"CUDA_VISIBLE_DEVICES", c.visible}}));
    EXPECT_EQ(done.number("total"), c.total) << c.visible;
  }
  const Finished none =
      run({worker(), "init"}, simulated(scratch, {{"CUDA_VISIBLE_DEVICES", "bogus,1"}}));
  EXPECT_EQ(none.value("result"), "100");  // CUDA_ERROR_NO_DEVICE
}

TEST(SimulatedMachine, BadDeviceListsNameTheFieldAndValue) {
  ScratchDirectory scratch;
  struct Case {
    const char* devices;
    const char* expected;
  } cases[] = {
      {"Z80", "unknown model 'Z80'"},
      {"H100,memory=lots", "memory='lots' is not a size"},
      {"H100,colour=red", "unknown field 'colour'"},
      {"H100,uuid=XYZ", "uuid='XYZ' must look like GPU-"},
      {"", "no devices listed"},
  };
  for (const Case& c : cases) {
    const Finished done =
        run({worker(), "init"}, unhooked(scratch, {{"TESSERA_SIM_DEVICES", c.devices}}));
    EXPECT_EQ(done.value("result"), "100") << c.devices;
    EXPECT_NE(done.err.find(c.expected), std::string::npos) << c.devices << ": " << done.err;
    EXPECT_NE(done.err.find("TESSERA_SIM_DEVICES"), std::string::npos) << done.err;
  }
}

// The device's own record of a finished worker's kernels within its window.
sim::BusyTime recorded(const ScratchDirectory& scratch, const Finished& done) {
  setenv("TESSERA_SIM_STATE", scratch.file("simgpu").c_str(), 1);
  setenv("TESSERA_SIM_DEVICES", kTestDevices, 1);
  ErrorText error;
  sim::Machine machine;
  EXPECT_TRUE(machine.attach(error)) << error.text;
  const sim::BusyTime busy = machine.busy(0, static_cast<std::int32_t>(done.number("pid")),
                                          done.number("begin_ns"), done.number("end_ns"));
  EXPECT_TRUE(busy.complete);
  return busy;
}

class KernelPath : public ::testing::TestWithParam<const char*> {};

TEST_P(KernelPath, KernelsTakeTheirTimeOnTheDevice) {
  ScratchDirectory scratch;
  const Finished done =
      run({worker(), "kernels", GetParam(), "step@2ms", "20"}, simulated(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  const std::uint64_t wall = done.number("end_ns") - done.number("begin_ns");
  EXPECT_GE(wall, 40'000'000u);  // 20 x 2 ms, in order
  // Events span the kernels, and the moments between recording the first and launching the
  // first kernel (as long as the host kept the worker from launching): at least the
  // kernels' time, at most the worker's window. How much more is the host's doing.
  EXPECT_GE(done.number("elapsed_us"), 40000u);
  EXPECT_LE(done.number("elapsed_us"), wall / 1000);
  EXPECT_EQ(done.value("query_before_sync"), "600");  // CUDA_ERROR_NOT_READY
  const sim::BusyTime busy = recorded(scratch, done);
  EXPECT_EQ(busy.process_ns, 40'000'000u);
  EXPECT_EQ(busy.device_ns, 40'000'000u);
}

TEST(SimulatedMachine, NvmlAnswersTheOlderNamesAndPerProcessUtilisation) {
  ScratchDirectory scratch;
  const Finished done = run({worker(), "nvml-peers", "step@2ms", "50"}, simulated(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(done.value("handle_status"), "0");
  // Before any kernel, no process has a sample: NVML_ERROR_NOT_FOUND, and none to size for.
  EXPECT_EQ(done.value("idle_size_status"), "6");
  EXPECT_EQ(done.value("idle_status"), "6");
  // After 100 ms of kernels: one sample, sized first (NVML_ERROR_INSUFFICIENT_SIZE), its SM
  // utilisation over the last second as the device's record has it: 100 ms of 1 s, 10 %,
  // when the host ran the kernels within the second (else some of them fall before it).
  EXPECT_EQ(done.value("busy_size_status"), "7");
  EXPECT_EQ(done.value("busy_size"), "1");
  ASSERT_EQ(done.value("busy_status"), "0") << done.out;
  EXPECT_GE(done.number("busy_sm_util"), done.number("busy_span_ns") < 900'000'000 ? 10u : 1u);
  EXPECT_LE(done.number("busy_sm_util"), 100u);
  EXPECT_EQ(done.value("processes_status"), "0");
  EXPECT_EQ(done.value("listed_self"), "1");
}

INSTANTIATE_TEST_SUITE_P(SimulatedMachine, KernelPath,
                         ::testing::Values("plain", "ex", "coop", "graph"));

TEST(SimulatedMachine, AGridLargerThanTheDeviceTakesSeveralWaves) {
  ScratchDirectory scratch;
  // 264 blocks on an H100's 132 SMs: two waves of 1 ms each.
  const Finished done =
      run({worker(), "kernels", "plain", "wide@1ms", "5", "264"}, simulated(scratch));
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_EQ(recorded(scratch, done).process_ns, 10'000'000u);  // the device's own record
  EXPECT_GE(done.number("elapsed_us"), 10000u);
  EXPECT_LE(done.number("elapsed_us"), (done.number("end_ns") - done.number("begin_ns")) / 1000);
}

TEST(SimulatedMachine, ProcessesShareOneTimelineOnePieceOfWorkAtATime) {
  ScratchDirectory scratch;
  Running first({worker(), "kernels", "plain", "a@2ms", "50"}, simulated(scratch));
  Running second({worker(), "kernels", "plain", "b@2ms", "50"}, simulated(scratch));
  Finished results[2];
  for (int i = 0; i < 2; ++i) {
    Running& process = i == 0 ? first : second;
    std::string line;
    while (!(line = process.read_line()).empty()) results[i].out += line + "\n";
    EXPECT_EQ(process.wait(), 0);
  }
  const std::uint64_t begin =
      std::min(results[0].number("begin_ns"), results[1].number("begin_ns"));
  const std::uint64_t end = std::max(results[0].number("end_ns"), results[1].number("end_ns"));
  EXPECT_GE(end - begin, 200'000'000u);  // 200 ms of work cannot finish sooner on one device
  setenv("TESSERA_SIM_STATE", scratch.file("simgpu").c_str(), 1);
  setenv("TESSERA_SIM_DEVICES", kTestDevices, 1);
  ErrorText error;
  sim::Machine machine;
  ASSERT_TRUE(machine.attach(error)) << error.text;
  for (const Finished& result : results) {
    const auto pid = static_cast<std::int32_t>(result.number("pid"));
    EXPECT_EQ(machine.busy(0, pid, begin, end).process_ns, 100'000'000u);
  }
  EXPECT_EQ(machine.busy(0, 0, begin, end).device_ns, 200'000'000u);
  EXPECT_EQ(machine.busy(1, 0, begin, end).device_ns, 0u);  // the other device was idle
}

TEST(SimulatedMachine, ProcessesTakeTurnsInTimeSlicesEvenInsideLongKernels) {
  ScratchDirectory scratch;
  // Half a second: long enough that the short one comes while it runs, however slowly the
  // host starts the second worker.
  Running long_kernel({worker(), "kernels", "plain", "long@500ms", "1"}, simulated(scratch));
  Finished first;
  // Its kernel is queued once it asks whether the work is done, before synchronising.
  for (std::string line; (line = long_kernel.read_line()).rfind("query_before_sync=", 0) != 0;) {
    ASSERT_FALSE(line.empty()) << "the long kernel's worker ended early";
  }
  const Finished second = run({worker(), "kernels", "plain", "short@1ms", "1"}, simulated(scratch));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  std::string line;
  while (!(line = long_kernel.read_line()).empty()) first.out += line + "\n";
  ASSERT_EQ(long_kernel.wait(), 0);
  // The device's record: the short kernel, queued after the long one had started, ran
  // within it, uninterrupted, and ended long before it (the host's timing plays no part).
  sim::Machine machine;
  setenv("TESSERA_SIM_STATE", scratch.file("simgpu").c_str(), 1);
  setenv("TESSERA_SIM_DEVICES", kTestDevices, 1);
  ErrorText error;
  ASSERT_TRUE(machine.attach(error)) << error.text;
  sim::WorkPiece long_piece{}, short_piece{};
  ASSERT_EQ(machine.pieces(0, static_cast<std::int32_t>(first.number("pid")), 0, UINT64_MAX,
                           &long_piece, 1),
            1);
  ASSERT_EQ(machine.pieces(0, static_cast<std::int32_t>(second.number("pid")), 0, UINT64_MAX,
                           &short_piece, 1),
            1);
  EXPECT_GT(short_piece.start_ns, long_piece.start_ns);
  EXPECT_EQ(short_piece.end_ns - short_piece.start_ns, 1'000'000u);
  EXPECT_LT(short_piece.end_ns, long_piece.end_ns);
  // Each got exactly its own time, the long kernel in several runs.
  EXPECT_EQ(recorded(scratch, first).process_ns, 500'000'000u);
  EXPECT_EQ(recorded(scratch, second).process_ns, 1'000'000u);
}

TEST(SimulatedMachine, DevicesComeFromAFileToo) {
  ScratchDirectory scratch;
  const std::string config = scratch.file("devices.conf");
  {
    FILE* file = std::fopen(config.c_str(), "w");
    std::fputs("# two small cards\nT4\nT4,memory=8GiB,name=Small T4\n", file);
    std::fclose(file);
  }
  const Finished done =
      run({worker(), "info"},
          unhooked(scratch, {{"TESSERA_SIM_CONFIG", config}, {"CUDA_VISIBLE_DEVICES", "1"}}));
  EXPECT_EQ(done.number("total"), 8 * kGiB);
}

}  // namespace
}  // namespace tessera::test
