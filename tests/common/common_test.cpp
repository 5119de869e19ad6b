// Sizes and limits as users write them, and the errors for what they get wrong; the checks of
// invariants (on here whatever the build, to see them fire).
#define TESSERA_DCHECKS 1
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/check.h"
#include "common/handle_table.h"
#include "common/limits.h"
#include "common/units.h"
#include "contract/variables.h"

namespace tessera {
namespace {

TEST(Check, ABrokenInvariantAbortsNamingItsConditionFileAndLine) {
  const int two = std::atoi("2");  // not a constant the compiler could fold
  TESSERA_DCHECK(two == 2);        // holds: nothing happens
  EXPECT_DEATH(TESSERA_DCHECK(two == 3),
               "tessera: invariant broken at .*common_test.cpp:[0-9]+: two == 3");
}

TEST(ParseSize, AcceptsTheUnitsPeopleWrite) {
  struct Case {
    const char* text;
    std::uint64_t bytes;
  } cases[] = {
      {"0", 0},
      {"4096", 4096},
      {"8GiB", 8ull << 30},
      {"8gib", 8ull << 30},
      {"8g", 8ull << 30},  // HAMi: k/m/g are base 1024
      {"8G", 8ull << 30},
      {"512MiB", 512ull << 20},
      {"512m", 512ull << 20},
      {"64k", 64ull << 10},
      {"1.5GiB", 3ull << 29},
      {"8GB", 8000000000ull},
      {" 2 GiB ", 2ull << 30},
      {"1TiB", 1ull << 40},
  };
  for (const Case& c : cases) {
    std::uint64_t bytes = 1;
    EXPECT_TRUE(parse_size(c.text, bytes)) << c.text;
    EXPECT_EQ(bytes, c.bytes) << c.text;
  }
}

TEST(ParseSize, RefusesWhatIsNotASize) {
  for (const char* text : {"", "GiB", "-1", "8XB", "8 GiB x", "1.5", "0x10", "1.GiB",
                           "99999999999999999999", "20000000000GiB"}) {
    std::uint64_t bytes = 0;
    EXPECT_FALSE(parse_size(text, bytes)) << text;
  }
}

TEST(MemoryLimits, OneSizeAppliesToEveryDevice) {
  DeviceLimits limits;
  ErrorText error;
  ASSERT_TRUE(parse_memory_limit_list(contract::kMemoryLimitVariable, "8GiB", limits, error));
  for (std::uint64_t bytes : limits.memory_bytes) EXPECT_EQ(bytes, 8ull << 30);
}

TEST(MemoryLimits, PerDeviceListSetsOnlyThoseDevices) {
  DeviceLimits limits;
  ErrorText error;
  ASSERT_TRUE(
      parse_memory_limit_list(contract::kMemoryLimitVariable, "0=8GiB,3=4GiB", limits, error));
  EXPECT_EQ(limits.memory_bytes[0], 8ull << 30);
  EXPECT_EQ(limits.memory_bytes[3], 4ull << 30);
  EXPECT_EQ(limits.memory_bytes[1], kUnlimited);
}

TEST(MemoryLimits, ASecondSourceCanOnlyLower) {
  DeviceLimits limits;
  ErrorText error;
  ASSERT_TRUE(parse_memory_limit_list("A", "0=4GiB", limits, error));
  ASSERT_TRUE(parse_memory_limit_list("B", "0=8GiB,1=2GiB", limits, error));
  EXPECT_EQ(limits.memory_bytes[0], 4ull << 30);
  EXPECT_EQ(limits.memory_bytes[1], 2ull << 30);
}

TEST(MemoryLimits, ErrorsNameTheVariableAndTheValue) {
  const std::string variable = contract::kMemoryLimitVariable;
  struct Case {
    const char* value;
    std::string expected;
  } cases[] = {
      {"8XB", variable + "='8XB': '8XB' is not a size"},
      {"0=", variable + "='0=': '' is not a size"},
      {"16=1G", "'16=1G' is not DEVICE=SIZE"},
      {"a=1G", "'a=1G' is not DEVICE=SIZE"},
      {"0=1G,", "'' is not DEVICE=SIZE"},
      {"0", "a memory limit must be larger than 0"},
  };
  for (const Case& c : cases) {
    DeviceLimits limits;
    ErrorText error;
    EXPECT_FALSE(parse_memory_limit_list(contract::kMemoryLimitVariable, c.value, limits, error))
        << c.value;
    EXPECT_NE(std::string(error.text).find(c.expected), std::string::npos)
        << c.value << " gave: " << error.text;
  }
}

TEST(MemoryLimits, HamiVariablesAreRead) {
  setenv(contract::kHamiMemoryLimitVariable, "6g", 1);
  const std::string second = std::string(contract::kHamiMemoryLimitVariable) + "_1";
  setenv(second.c_str(), "2048m", 1);
  DeviceLimits limits;
  ErrorText error;
  EXPECT_TRUE(memory_limits_from_environment(limits, error)) << error.text;
  unsetenv(contract::kHamiMemoryLimitVariable);
  unsetenv(second.c_str());
  EXPECT_EQ(limits.memory_bytes[0], 6ull << 30);
  EXPECT_EQ(limits.memory_bytes[1], 2ull << 30);
}

TEST(HandleTable, StoresTakesAndGrowsThroughTombstones) {
  HandleTable<int> table;
  for (int round = 0; round < 4; ++round) {
    for (std::uint64_t key = 1; key <= 5000; ++key) {
      ASSERT_TRUE(table.put(key * 4096, static_cast<int>(key)));
    }
    EXPECT_EQ(table.size(), 5000u);
    for (std::uint64_t key = 1; key <= 5000; ++key) {
      int value = 0;
      ASSERT_TRUE(table.take(key * 4096, value));
      EXPECT_EQ(value, static_cast<int>(key));
    }
    EXPECT_EQ(table.size(), 0u);
    int ignored;
    EXPECT_FALSE(table.take(4096, ignored));
  }
}

}  // namespace
}  // namespace tessera
