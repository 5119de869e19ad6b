// The guest libraries are good guests: they depend on nothing but the C library and export
// only what they interpose (the hook) or implement (the simulated driver).
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "support.h"

namespace tessera::test {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return lines;
}

std::vector<std::string> needed(const std::string& library) {
  const Finished done = run({"/usr/bin/readelf", "-d", library});
  EXPECT_EQ(done.exit_code, 0) << done.err;
  std::vector<std::string> result;
  const std::regex pattern(R"(\(NEEDED\).*\[(.*)\])");
  for (const std::string& line : lines_of(done.out)) {
    std::smatch match;
    if (std::regex_search(line, match, pattern)) result.push_back(match[1]);
  }
  return result;
}

std::vector<std::string> exported(const std::string& library) {
  const Finished done = run({"/usr/bin/nm", "-D", "--defined-only", library});
  EXPECT_EQ(done.exit_code, 0) << done.err;
  std::vector<std::string> result;
  for (const std::string& line : lines_of(done.out)) {
    const std::size_t space = line.rfind(' ');
    if (space != std::string::npos) result.push_back(line.substr(space + 1));
  }
  return result;
}

TEST(GuestLibraries, NeedNothingButTheCLibrary) {
  for (const char* library :
       {"lib/libtessera-cuda.so", "sim/libcuda.so.1", "sim/libnvidia-ml.so.1"}) {
    for (const std::string& dependency : needed(build_path(library))) {
      EXPECT_TRUE(dependency == "libc.so.6" || dependency == "ld-linux-x86-64.so.2")
          << library << " needs " << dependency;
    }
  }
}

TEST(GuestLibraries, TheHookExportsOnlyWhatItInterposes) {
  const std::vector<std::string> symbols = exported(build_path("lib/libtessera-cuda.so"));
  EXPECT_GT(symbols.size(), 40u);
  const std::regex allowed(R"(^(cu[A-Z]\w*|nvml[A-Z]\w*|dlsym)$)");
  for (const std::string& symbol : symbols) {
    EXPECT_TRUE(std::regex_match(symbol, allowed)) << symbol;
  }
}

TEST(GuestLibraries, TheHookDoesNothingAtLoadTime) {
  // Loading the hook into a program that never touches CUDA must be invisible.
  ScratchDirectory scratch;
  const Finished done =
      run({"/bin/echo", "hello"}, hooked(scratch, {{"TESSERA_LOG_LEVEL", "debug"}}));
  EXPECT_EQ(done.exit_code, 0);
  EXPECT_EQ(done.out, "hello\n");
  EXPECT_EQ(done.err, "");
}

}  // namespace
}  // namespace tessera::test
