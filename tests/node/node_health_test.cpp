// What makes a GPU unhealthy, as NVIDIA's lists and variables say.
#include "node_fixtures.h"

namespace tessera::test {
namespace {

TEST(NodeHealth, WhatMakesAGpuUnhealthyFollowsNvidiasListsAndVariables) {
  const HealthSettings defaults;
  HealthPolicy policy = health_policy(defaults, nullptr, nullptr, std::chrono::seconds(60));
  EXPECT_TRUE(policy.critical(abi::nvmlEventTypeXidCriticalError, 79));
  for (const std::uint64_t xid : {13, 31, 43, 45, 68, 109}) {
    EXPECT_FALSE(policy.critical(abi::nvmlEventTypeXidCriticalError, xid)) << xid;
  }
  EXPECT_TRUE(policy.critical(abi::nvmlEventTypeDoubleBitEccError, 0));
  EXPECT_FALSE(policy.critical(abi::nvmlEventTypeSingleBitEccError, 0));  // corrected
  EXPECT_FALSE(
      health_policy(defaults, "all", nullptr, {}).critical(abi::nvmlEventTypeXidCriticalError, 79));
  EXPECT_FALSE(health_policy(defaults, "xids", nullptr, {}).enabled);
  policy = health_policy(defaults, "79, 94,banana", nullptr, {});
  EXPECT_FALSE(policy.critical(abi::nvmlEventTypeXidCriticalError, 79));
  EXPECT_FALSE(policy.critical(abi::nvmlEventTypeXidCriticalError, 94));
  EXPECT_TRUE(policy.critical(abi::nvmlEventTypeXidCriticalError, 48));
  EXPECT_EQ(policy.notes.size(), 1u);  // banana, said
  EXPECT_TRUE(
      health_policy(defaults, nullptr, "13", {}).critical(abi::nvmlEventTypeXidCriticalError, 13));
  EXPECT_TRUE(
      health_policy(defaults, nullptr, "all", {}).critical(abi::nvmlEventTypeXidCriticalError, 31));
  // NVIDIA's health section.
  const PluginConfig only =
      parse_plugin_config("health: {criticalXIDs: [79, 48], ignoredXIDs: [13]}", "h");
  policy = health_policy(only.health, nullptr, nullptr, {});
  EXPECT_TRUE(policy.critical(abi::nvmlEventTypeXidCriticalError, 79));
  EXPECT_FALSE(policy.critical(abi::nvmlEventTypeXidCriticalError, 92));
  EXPECT_FALSE(health_policy(parse_plugin_config("health: {disabled: true}", "d").health, nullptr,
                             nullptr, {})
                   .critical(abi::nvmlEventTypeXidCriticalError, 79));

  // The board: one error makes a GPU unhealthy; quiet for the period, it recovers.
  HealthBoard board(2);
  const auto start = HealthBoard::Clock::now();
  EXPECT_TRUE(board.record_error(1, "XID 79", start));
  EXPECT_FALSE(board.record_error(1, "XID 79", start + std::chrono::seconds(5)));  // still down
  EXPECT_TRUE(board.healthy(0));
  EXPECT_FALSE(board.recover(std::chrono::seconds(10), start + std::chrono::seconds(14)));
  EXPECT_TRUE(board.recover(std::chrono::seconds(10), start + std::chrono::seconds(15)));
  EXPECT_TRUE(board.healthy(1));
  EXPECT_EQ(board.errors(1), 2u);
  EXPECT_TRUE(board.record_error(-1, "event wait failed", start));  // every GPU
  EXPECT_FALSE(board.healthy(0));
  EXPECT_FALSE(board.recover(std::chrono::seconds(0), start + std::chrono::hours(1)));  // 0: never
  // A GPU held down (it cannot be watched) counts no error and stays down while held.
  HealthBoard held(1);
  EXPECT_TRUE(held.hold_down(0, "cannot be watched", start));
  EXPECT_FALSE(held.hold_down(0, "cannot be watched", start + std::chrono::seconds(20)));
  EXPECT_FALSE(held.recover(std::chrono::seconds(10), start + std::chrono::seconds(25)));
  EXPECT_EQ(held.errors(0), 0u);
}

}  // namespace
}  // namespace tessera::test
