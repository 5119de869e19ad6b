// Kubernetes quantities as pods and nodes write them, read exactly, and what is refused.
#include <gtest/gtest.h>

#include <string>

#include "kube/quantity.h"

namespace tessera::kube {
namespace {

TEST(KubeQuantity, CpuIsReadToMilliCpuRoundedUp) {
  const std::pair<const char*, std::int64_t> cases[] = {
      {"2", 2000}, {"500m", 500}, {"1.5", 1500},   {"2e3", 2000000}, {"0.0001", 1},
      {"100u", 1}, {"+1", 1000},  {"1k", 1000000}, {"0", 0},         {"1500000n", 2}};
  for (const auto& [text, milli] : cases) {
    std::int64_t read = -1;
    EXPECT_TRUE(parse_cpu_milli(text, read)) << text;
    EXPECT_EQ(read, milli) << text;
  }
}

TEST(KubeQuantity, MemoryIsReadToMibRoundedUp) {
  const std::pair<const char*, std::int64_t> cases[] = {
      {"1Gi", 1024},  {"512Mi", 512},  {"1G", 954},      {"1000", 1},        {"1048576", 1},
      {"1048577", 2}, {"1.5Gi", 1536}, {"2Ti", 2 << 20}, {"128974848", 123}, {"1e9", 954}};
  for (const auto& [text, mib] : cases) {
    std::int64_t read = -1;
    EXPECT_TRUE(parse_memory_mib(text, read)) << text;
    EXPECT_EQ(read, mib) << text;
  }
}

TEST(KubeQuantity, CountsAreWholeNumbers) {
  std::int64_t count = -1;
  EXPECT_TRUE(parse_count("8", count));
  EXPECT_EQ(count, 8);
  EXPECT_TRUE(parse_count("1k", count));
  EXPECT_EQ(count, 1000);
  for (const char* fraction : {"1.5", "500m", "1Ki1"}) EXPECT_FALSE(parse_count(fraction, count));
}

TEST(KubeQuantity, WhatIsNotAQuantityOrPastTheBoundsIsRefused) {
  std::int64_t value = -7;
  for (const char* text : {"", "m", "-1", "1.2.3", "1 Gi", "1gi", "1Xi", "e3", "1e", "1e41", "0x10",
                           "one", "1Ki ", "99999999999999999999999999999999"}) {
    EXPECT_FALSE(parse_cpu_milli(text, value)) << text;
    EXPECT_FALSE(parse_memory_mib(text, value)) << text;
  }
  EXPECT_EQ(value, -7);                        // a refusal leaves the value alone
  EXPECT_FALSE(parse_cpu_milli("2E", value));  // an exabyte of CPU is past the bound
  EXPECT_FALSE(parse_memory_mib("2Ei", value));
  EXPECT_TRUE(parse_memory_mib("1023Pi", value));
  EXPECT_FALSE(parse_count("2000000", value));  // past kMostCount
}

}  // namespace
}  // namespace tessera::kube
