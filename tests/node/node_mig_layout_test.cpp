// The tessera.io/mig-layout annotation as the node agent reads it: a layout, or a refusal
// saying what is wrong with it.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "node/mig_layout.h"

namespace tessera::node {
namespace {

TEST(MigLayoutAnnotation, ALayoutIsReadByGpuIndexAndProfile) {
  const WantedMigLayout wanted =
      parse_mig_layout(R"({"0": {"3g.40gb": 1, "1g.10gb": 4}, "3": {}, "1": {"7g.80gb": 0}})");
  ASSERT_EQ(wanted.size(), 3u);
  EXPECT_EQ(wanted.at(0), (mig::ProfileCounts{{"3g.40gb", 1}, {"1g.10gb", 4}}));
  EXPECT_TRUE(wanted.at(3).empty());  // MIG on, no instances
  EXPECT_EQ(wanted.at(1), (mig::ProfileCounts{{"7g.80gb", 0}}));
}

TEST(MigLayoutAnnotation, WhatIsNotALayoutIsRefusedSayingWhy) {
  const struct {
    std::string text;
    const char* expected;
  } cases[] = {
      {"{", "parse error"},
      {"[1, 2]", "not a JSON object of GPU indices"},
      {R"({"gpu0": {}})", "'gpu0' is not a GPU index"},
      {R"({"-1": {}})", "'-1' is not a GPU index"},
      {R"({"64": {}})", "'64' is not a GPU index (0 to 63)"},
      {R"({"0": 3})", "GPU 0: not an object of profile counts"},
      {R"({"0": {"1g.10gb": 8}})", "GPU 0: 1g.10gb count 8 is not 0 to 7"},
      {R"({"0": {"1g.10gb": -1}})", "count -1 is not 0 to 7"},
      {R"({"0": {"1g.10gb": 1.5}})", "count 1.5 is not 0 to 7"},
      {R"({"0": {"1g.10gb": "2"}})", R"(count "2" is not 0 to 7)"},
      {R"({"0": {"": 1}})", "'' is not a profile name"},
      {R"({"0": {")" + std::string(40, 'x') + R"(": 1}})", "is not a profile name"},
      {std::string(70000, ' '), "70000 bytes; at most 65536"},
      {std::string(20000, '[') + std::string(20000, ']'), "nested deeper than 64 levels"},
  };
  for (const auto& c : cases) {
    try {
      parse_mig_layout(c.text);
      ADD_FAILURE() << "accepted: " << c.text.substr(0, 80);
    } catch (const std::invalid_argument& refused) {
      EXPECT_NE(std::string(refused.what()).find(c.expected), std::string::npos)
          << c.expected << " vs: " << refused.what();
    }
  }
}

}  // namespace
}  // namespace tessera::node
