// The host base library: strings as configs and annotations write them, and the annotated
// mutexes doing what they say.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/mutex.h"
#include "base/strings.h"

namespace tessera::base {
namespace {

TEST(BaseStrings, LowerChangesAsciiLettersOnly) {
  EXPECT_EQ(lower("NVIDIA A100-SXM4-40GB"), "nvidia a100-sxm4-40gb");
  EXPECT_EQ(lower(""), "");
  EXPECT_EQ(lower("\xc3\x89t\xc3\xa9"), "\xc3\x89t\xc3\xa9");  // bytes above ASCII are kept
}

TEST(BaseStrings, SplitKeepsEveryPartEmptyOnesToo) {
  EXPECT_EQ(split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(split("", ','), (std::vector<std::string>{""}));
  EXPECT_EQ(split(",", ','), (std::vector<std::string>{"", ""}));
  EXPECT_EQ(split("1g.10gb", '.'), (std::vector<std::string>{"1g", "10gb"}));
}

TEST(BaseStrings, SplitListDropsBlanksAndEmptyParts) {
  EXPECT_EQ(split_list(" A100 , H100,,\tL4 ", ','),
            (std::vector<std::string>{"A100", "H100", "L4"}));
  EXPECT_TRUE(split_list("", ',').empty());
  EXPECT_TRUE(split_list(" , ,", ',').empty());
}

TEST(BaseStrings, JoinPutsTheSeparatorBetweenPartsOnly) {
  EXPECT_EQ(join({"GPU-a", "GPU-b", "GPU-c"}, ","), "GPU-a,GPU-b,GPU-c");
  EXPECT_EQ(join({"one"}, ", "), "one");
  EXPECT_EQ(join({}, ","), "");
  EXPECT_EQ(join(split("x,,y", ','), ","), "x,,y");  // split and join undo each other
}

TEST(BaseMutex, AWaitEndsWithTheSignalOrTheDeadlineWithTheLockHeld) {
  Mutex mutex;
  CondVar changed;
  bool ready = false;
  std::thread signaller([&] {
    MutexLock locked(mutex);
    ready = true;
    changed.notify_all();
  });
  {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    MutexLock locked(mutex);
    while (!ready && changed.wait_until(mutex, deadline)) {
    }
    EXPECT_TRUE(ready);  // read under the lock the wait gave back
  }
  signaller.join();
  MutexLock locked(mutex);
  // Nobody signals now: the wait ends at its deadline, and says so.
  EXPECT_FALSE(changed.wait_until(mutex, std::chrono::steady_clock::now()));
}

}  // namespace
}  // namespace tessera::base
