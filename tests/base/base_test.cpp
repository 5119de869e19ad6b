// The host base library: strings as configs and annotations write them, and the annotated
// mutexes doing what they say.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>
#include <vector>

#include "base/files.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/status.h"
#include "base/strings.h"
#include "base/yaml_document.h"

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

// The message a document refusal gives, or "" when `read` accepts.
template <typename Read>
std::string refusal_of(Read read) {
  try {
    read();
  } catch (const DocumentError& error) {
    return error.what();
  }
  return "";
}

TEST(BaseYamlDocument, LoadingRefusesWhatIsTooLongTooDeepOrNotYaml) {
  EXPECT_EQ(load_yaml("a: 1\n", "f.yaml", 1024, 8)["a"].as<int>(), 1);
  EXPECT_EQ(refusal_of([] { load_yaml(std::string(2048, '#'), "f.yaml", 1024, 8); }),
            "f.yaml: larger than 1 KiB");
  EXPECT_EQ(
      refusal_of([] { load_yaml(std::string(9, '[') + std::string(9, ']'), "f.yaml", 1024, 8); }),
      "f.yaml: nested more than 8 deep");
  EXPECT_EQ(refusal_of([] { load_yaml("'[' ]", "f.yaml", 1024, 8); }).rfind("f.yaml: not YAML", 0),
            0u);
  // Brackets inside quotes do not nest.
  EXPECT_EQ(refusal_of([] { load_yaml("a: '[[[[[[[[[['\n", "f.yaml", 1024, 8); }), "");
}

TEST(BaseYamlDocument, TheReaderNamesTheFileTheFieldAndTheValue) {
  const YAML::Node root = YAML::Load("name: 12\nflag: maybe\ncount: 300\nkind: round\nextra: 1\n");
  YamlReader reader("f.yaml");
  EXPECT_EQ(refusal_of([&] { reader.text(root["name"], "name"); }),
            "f.yaml: name: must be a string, not 12 (quote it)");
  EXPECT_EQ(refusal_of([&] { reader.boolean(root["flag"], "flag"); }),
            "f.yaml: flag: must be true or false, not 'maybe'");
  EXPECT_EQ(refusal_of([&] { reader.integer(root["count"], "count", 1, 100); }),
            "f.yaml: count: 300 is out of range (1 to 100)");
  EXPECT_EQ(
      refusal_of([&] {
        reader.choice<int>(root["kind"], "kind", {{"square", 0}, {"flat", 1}}, "unknown kind: ");
      }),
      "f.yaml: kind: unknown kind: round (one of: square, flat)");
  EXPECT_EQ(refusal_of([&] {
              reader.check_keys(root, "", {"name", "flag", "count", "kind"});
            }),
            "f.yaml: extra: unknown field (known here: name, flag, count, kind)");
  EXPECT_EQ(refusal_of([&] { reader.expect_map(root["name"], "name"); }),
            "f.yaml: name: must be a mapping, not '12'");
  EXPECT_TRUE(reader.boolean(YAML::Load("on"), "x"));  // Go's YAML 1.1 words
  EXPECT_EQ(reader.text(YAML::Load("'12'"), "x"), "12");
}

TEST(BaseYamlDocument, AnAliasBombIsRefusedNotWalked) {
  std::string text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char name = 'b'; name <= 'h'; ++name) {
    const char previous = static_cast<char>(name - 1);
    text += std::string(1, name) + ": &" + name + " [";
    for (int i = 0; i < 10; ++i) text += std::string(i ? ", *" : "*") + previous;
    text += "]\n";
  }
  const YAML::Node root = load_yaml(text, "bomb.yaml", 1 << 20, 32);
  YamlReader reader("bomb.yaml");
  // Ten to the eighth leaves: the walk stops at the reader's bound, with the reason.
  std::function<void(const YAML::Node&)> walk = [&](const YAML::Node& node) {
    reader.visit("h");
    if (node.IsSequence())
      for (const auto& child : node) walk(child);
  };
  EXPECT_EQ(refusal_of([&] { walk(root["h"]); }), "bomb.yaml: h: the config is too large a tree");
}

TEST(BaseStatus, AFailureKeepsItsMessageAndGainsWhatWasBeingDone) {
  EXPECT_TRUE(Status::success().ok());
  EXPECT_EQ(Status::success().message(), "");
  const Status failed = Status::failure("HTTP 403");
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(failed.within("listing pods").message(), "listing pods: HTTP 403");
  EXPECT_TRUE(Status::success().within("listing pods").ok());
}

TEST(BaseFiles, AnAtomicWriteLeavesTheWholeFileOrSaysWhichFileFailed) {
  char pattern[] = "/tmp/tessera-base-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string directory = pattern;
  ASSERT_TRUE(write_file_atomically(directory + "/f", "first").ok());
  ASSERT_TRUE(write_file_atomically(directory + "/f", "second").ok());
  std::ifstream input(directory + "/f");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(input), {}), "second");
  const Status refused = write_file_atomically(directory + "/missing/f", "x");
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find(directory + "/missing/"), std::string::npos)
      << refused.message();
  std::filesystem::remove_all(directory);
}

TEST(BaseLog, LinesCarryProgramPidAndLevelAndTheLevelFiltersThem) {
  std::vector<std::string> lines;
  const ProgramLog::Sink sink = [&](std::string_view line) { lines.emplace_back(line); };
  const ProgramLog log("node", nullptr, sink);  // unset: info
  log.info("3 GPU(s)");
  log.write(LogLevel::debug, "not shown at info");
  log.reporter(LogLevel::warn)("node gpu-1 cannot be read");
  const std::string pid = std::to_string(getpid());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "tessera node[" + pid + "] info: 3 GPU(s)\n");
  EXPECT_EQ(lines[1], "tessera node[" + pid + "] warning: node gpu-1 cannot be read\n");
  lines.clear();
  const ProgramLog quiet("scheduler", "error", sink);
  quiet.warning("dropped");
  quiet.error("kept");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("error: kept"), std::string::npos);
}

TEST(BaseLog, ALevelThatIsNoneIsSaidOnceAndInfoKept) {
  std::vector<std::string> lines;
  const ProgramLog log("node", "verbose\nX-Injected",
                       [&](std::string_view line) { lines.emplace_back(line); });
  EXPECT_EQ(log.level(), LogLevel::info);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(R"(TESSERA_LOG_LEVEL="verbose\nX-Injected")"), std::string::npos)
      << lines[0];
  EXPECT_EQ(lines[0].find('\n'), lines[0].size() - 1);  // one line
  EXPECT_NE(lines[0].find("logging at info"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace tessera::base
