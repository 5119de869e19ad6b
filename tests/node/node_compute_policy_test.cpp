// The GPUs' time slice, set through nvidia-smi compute-policy: every GPU asked, a GPU that
// refuses reported by index, a tool that cannot run said so. nvidia-smi here is a script that
// records how it was called.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include "node/compute_policy.h"
#include "support.h"

namespace tessera::test {
namespace {

using namespace tessera::node;

Inventory gpus(unsigned count) {
  Inventory inventory;
  for (unsigned i = 0; i < count; ++i) {
    GpuInfo gpu;
    gpu.index = i;
    inventory.gpus.push_back(gpu);
  }
  return inventory;
}

// A stand-in nvidia-smi that appends its arguments to `calls` and fails for GPU `failing`.
std::string fake_nvidia_smi(const ScratchDirectory& scratch, int failing) {
  const std::string path = scratch.file("nvidia-smi");
  std::ofstream(path) << "#!/bin/sh\necho \"$@\" >> " << scratch.file("calls") << "\n"
                      << "[ \"$3\" = " << failing << " ] && exit 3\nexit 0\n";
  chmod(path.c_str(), 0755);
  return path;
}

TEST(NodeComputePolicy, EveryGpuIsAskedAndOneThatRefusesIsReported) {
  ScratchDirectory scratch;
  std::vector<std::string> said;
  const auto report = [&](const std::string& text) { said.push_back(text); };
  EXPECT_TRUE(apply_compute_timeslice(fake_nvidia_smi(scratch, -1), gpus(2), 2, report));
  EXPECT_EQ(read_text_file(scratch.file("calls")),
            "compute-policy -i 0 --set-timeslice 2\ncompute-policy -i 1 --set-timeslice 2\n");
  ASSERT_EQ(said.size(), 1u);
  EXPECT_EQ(said[0], "time slice medium set on 2 GPU(s) (nvidia-smi compute-policy)");

  said.clear();
  EXPECT_FALSE(apply_compute_timeslice(fake_nvidia_smi(scratch, 1), gpus(3), 3, report));
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("GPU 1: the time slice stays as it was"), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("exited 3"), std::string::npos) << said[0];
}

TEST(NodeComputePolicy, AToolThatCannotRunIsSaidNotThrown) {
  std::vector<std::string> said;
  EXPECT_FALSE(apply_compute_timeslice("/nonexistent/nvidia-smi", gpus(1), 1,
                                       [&](const std::string& text) { said.push_back(text); }));
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("cannot run /nonexistent/nvidia-smi"), std::string::npos) << said[0];
  EXPECT_STREQ(timeslice_name(0), "default");
  EXPECT_STREQ(timeslice_name(3), "long");
  EXPECT_STREQ(timeslice_name(7), "?");
}

}  // namespace
}  // namespace tessera::test
