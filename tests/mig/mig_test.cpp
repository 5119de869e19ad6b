// MIG: the built-in profile catalog against the simulated GPU's own tables (read through
// NVML, as on a real GPU), the planner against a brute-force search of every layout each
// model allows, reconciliation, and mig-parted's config format with its messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "contract/variables.h"
#include "mig/advisor.h"
#include "mig/catalog.h"
#include "mig/nvml_catalog.h"
#include "mig/parted_config.h"
#include "mig/planner.h"
#include "node/nvml.h"
#include "simgpu/sim_machine.h"
#include "support.h"

namespace tessera::test {
namespace {

using namespace tessera::mig;

const GpuModel& model(const std::string& key) {
  const GpuModel* found = find_model(key);
  EXPECT_NE(found, nullptr) << key;
  return *found;
}

TEST(MigCatalog, EveryModelAgreesWithWhatTheSimulatedGpuReportsThroughNvml) {
  ScratchDirectory scratch;
  setenv("TESSERA_SIM_STATE", scratch.file("simgpu").c_str(), 1);
  setenv("TESSERA_SIM_DEVICES", "H100;H200;A100;A100-80GB;A30;T4", 1);
  node::Nvml nvml(build_path("sim/libnvidia-ml.so.1"));
  const node::Inventory inventory = node::read_inventory(nvml);
  ASSERT_EQ(inventory.gpus.size(), 6u);
  for (const node::GpuInfo& gpu : inventory.gpus) {
    abi::nvmlDevice_t device = nullptr;
    ASSERT_EQ(nvml.nvmlDeviceGetHandleByIndex_v2(gpu.index, &device), abi::NVML_SUCCESS);
    const NvmlCatalog reported = read_nvml_catalog(
        {nvml.nvmlDeviceGetGpuInstanceProfileInfoV,
         nvml.nvmlDeviceGetGpuInstancePossiblePlacements_v2},
        device, gpu.name, [&](abi::nvmlReturn_t status) { return nvml.error_text(status); });
    const GpuModel* builtin = find_model(gpu.name);
    if (gpu.name == "Tesla T4") {  // no MIG: no profiles, and a note that says so
      EXPECT_EQ(builtin, nullptr);
      EXPECT_TRUE(reported.model.profiles.empty());
      ASSERT_EQ(reported.notes.size(), 1u);
      EXPECT_NE(reported.notes[0].find("Not Supported"), std::string::npos) << reported.notes[0];
      continue;
    }
    ASSERT_NE(builtin, nullptr) << gpu.name;
    EXPECT_TRUE(reported.notes.empty()) << reported.notes[0];
    EXPECT_EQ(reported.model.memory_slices, builtin->memory_slices) << gpu.name;
    EXPECT_EQ(reported.model.compute_slices, builtin->compute_slices) << gpu.name;
    const std::vector<std::string> differences = catalog_differences(*builtin, reported.model);
    EXPECT_TRUE(differences.empty()) << gpu.name << ": " << differences.front();
  }
}

TEST(MigCatalog, ADifferenceIsNamedByProfileAndField) {
  GpuModel changed = model("H200");
  changed.profiles[0].memory_mib += 512;
  changed.profiles[1].starts = {0};
  changed.profiles.pop_back();
  const std::vector<std::string> differences = catalog_differences(model("H200"), changed);
  ASSERT_EQ(differences.size(), 3u);
  EXPECT_EQ(differences[0], "1g.18gb: memory MiB 16384 here, 16896 reported");
  EXPECT_EQ(differences[1], "1g.18gb+me: starts {0,1,2,3,4,5,6} here, {0} reported");
  EXPECT_EQ(differences[2], "7g.141gb: not reported");
}

TEST(MigCatalog, ModelsAreFoundByNvmlNameOrKeyAndResourceNamesHaveNoPlus) {
  EXPECT_EQ(find_model("NVIDIA A100-SXM4-80GB")->key, "A100-80GB");
  EXPECT_EQ(find_model("nvidia h200")->key, "H200");
  EXPECT_EQ(find_model("A30")->memory_slices, 4);
  EXPECT_EQ(find_model("Tesla T4"), nullptr);
  EXPECT_EQ(resource_profile_name("1g.10gb+me"), "1g.10gb.me");
  EXPECT_EQ(resource_profile_name("3g.40gb"), "3g.40gb");
}

// Every layout a model allows, by brute force: instances added in (profile, start) order.
std::set<ProfileCounts> layouts_by_brute_force(const GpuModel& gpu) {
  std::set<ProfileCounts> found;
  std::vector<Instance> all;
  for (const Profile& profile : gpu.profiles) {
    for (const int start : profile.starts) all.push_back({&profile, start});
  }
  Layout layout;
  std::function<void(std::size_t)> grow = [&](std::size_t from) {
    found.insert(counts_of(layout));
    for (std::size_t i = from; i < all.size(); ++i) {
      layout.push_back(all[i]);
      if (legal(gpu, layout)) grow(i + 1);
      layout.pop_back();
    }
  };
  grow(0);
  return found;
}

TEST(MigPlanner, PlacesEveryMultisetThatSomeLayoutHoldsAndNoOther) {
  for (const GpuModel& gpu : builtin_catalog()) {
    const std::set<ProfileCounts> possible = layouts_by_brute_force(gpu);
    ASSERT_GT(possible.size(), 10u) << gpu.key;
    // Every multiset of up to `most` of each profile (one more of the 1g, beyond what fits).
    std::vector<int> counts(gpu.profiles.size(), 0);
    int checked = 0, placed = 0;
    std::function<void(std::size_t)> each = [&](std::size_t at) {
      if (at == gpu.profiles.size()) {
        ProfileCounts wanted;
        for (std::size_t i = 0; i < counts.size(); ++i) {
          if (counts[i] > 0) wanted[gpu.profiles[i].name] = counts[i];
        }
        const Plan plan = place(gpu, wanted);
        ++checked;
        EXPECT_EQ(plan.found, possible.count(wanted) > 0) << gpu.key << " " << plan.why;
        if (plan.found) {
          ++placed;
          std::string why;
          EXPECT_TRUE(legal(gpu, plan.layout, &why)) << gpu.key << ": " << why;
          EXPECT_EQ(counts_of(plan.layout), wanted);
        } else {
          EXPECT_FALSE(plan.why.empty());
          for (const ProfileCounts& nearest : plan.nearest) {
            EXPECT_TRUE(possible.count(nearest) > 0) << gpu.key;
          }
        }
      } else {
        for (int n = 0; n <= gpu.profiles[at].most + (at == 0 ? 1 : 0); ++n) {
          counts[at] = n;
          each(at + 1);
        }
        counts[at] = 0;
      }
    };
    each(0);
    EXPECT_EQ(static_cast<std::size_t>(placed), possible.size()) << gpu.key;
    EXPECT_GT(checked, placed) << gpu.key;
  }
}

TEST(MigPlanner, RefusalsSayWhyAndNameTheNearestLayoutsThatFit) {
  const GpuModel& a100 = model("A100-80GB");
  // A 4g and a 3g take all eight memory slices: no room for a 1g beside them.
  Plan plan = place(a100, {{"4g.40gb", 1}, {"3g.40gb", 1}, {"1g.10gb", 1}});
  ASSERT_FALSE(plan.found);
  EXPECT_NE(plan.why.find("they take 9 memory slices; A100-80GB has 8"), std::string::npos)
      << plan.why;
  ASSERT_FALSE(plan.nearest.empty());
  EXPECT_NE(std::find(plan.nearest.begin(), plan.nearest.end(),
                      ProfileCounts{{"4g.40gb", 1}, {"3g.40gb", 1}}),
            plan.nearest.end());
  // Slices enough, placements not: 2g x3 take slices 0-5, leaving 6-7 where no 2g may start.
  plan = place(a100, {{"2g.20gb", 3}, {"1g.20gb", 1}});
  EXPECT_TRUE(plan.found) << plan.why;  // the 1g.20gb may start at 6
  plan = place(a100, {{"3g.40gb", 1}, {"2g.20gb", 3}});
  ASSERT_FALSE(plan.found);
  EXPECT_NE(plan.why.find("memory slices"), std::string::npos) << plan.why;
  plan = place(a100, {{"9g.90gb", 1}});
  ASSERT_FALSE(plan.found);
  EXPECT_NE(plan.why.find("9g.90gb is not a MIG profile of A100-80GB (its profiles: 1g.10gb"),
            std::string::npos)
      << plan.why;
  plan = place(a100, {{"1g.10gb+me", 2}});
  ASSERT_FALSE(plan.found);
  EXPECT_NE(plan.why.find("holds at most 1 1g.10gb+me"), std::string::npos) << plan.why;
}

// The seeds show nvidia-smi mig -cgi 9 then 14,14 on an A100-80GB leaving the 3g at 0:4 and the
// 2g at 4:2 and 6:2. No 2g may start at slice 6 (NVML's placements for 2g are {0,2,4}, on an
// H200 too), so that layout cannot exist: the planner puts the 3g on the right half instead.
TEST(MigPlanner, ThreeGAndTwoTwoGFitOnlyWithTheThreeGOnTheRightHalf) {
  const GpuModel& a100 = model("A100-80GB");
  const Profile* three = a100.profile_named("3g.40gb");
  const Profile* two = a100.profile_named("2g.20gb");
  std::string why;
  EXPECT_FALSE(legal(a100, {{three, 0}, {two, 4}, {two, 6}}, &why));
  EXPECT_EQ(why, "2g.20gb cannot start at slice 6 (it starts at {0,2,4})");
  const Plan plan = place(a100, {{"3g.40gb", 1}, {"2g.20gb", 2}});
  ASSERT_TRUE(plan.found) << plan.why;
  std::vector<std::pair<std::string, int>> placed;
  for (const Instance& instance : plan.layout) {
    placed.emplace_back(instance.profile->name, instance.start);
  }
  std::sort(placed.begin(), placed.end());
  EXPECT_EQ(placed, (std::vector<std::pair<std::string, int>>{
                        {"2g.20gb", 0}, {"2g.20gb", 2}, {"3g.40gb", 4}}));
  EXPECT_EQ(
      picture(a100, plan.layout),
      "|2g.20gb              |2g.20gb              |3g.40gb                                    |");
  EXPECT_TRUE(place(a100, {{"1g.10gb", 7}}).found);
  EXPECT_TRUE(place(a100, {{"7g.80gb", 1}}).found);
  EXPECT_EQ(picture(a100, {}).find("free"), 1u);
}

TEST(MigPlanner, ReconcileKeepsWhatItCanAndNeverDestroysAnInstanceInUseUnlessForced) {
  const GpuModel& h100 = model("H100-80GB");
  const Profile* one = h100.profile_named("1g.10gb");
  const Profile* three = h100.profile_named("3g.40gb");
  // Now: 3g at 0 (in use), 1g at 4 and 5. Wanted: 3g, 2g, 1g.20gb: the 3g stays, the 1g go,
  // the 2g goes to 4 and the 1g.20gb to 6.
  std::vector<Existing> current = {
      {{three, 0}, 1, true}, {{one, 4}, 2, false}, {{one, 5}, 3, false}};
  Reconciliation result =
      reconcile(h100, current, {{"3g.40gb", 1}, {"2g.20gb", 1}, {"1g.20gb", 1}}, false);
  ASSERT_TRUE(result.ok) << result.why;
  int destroys = 0, creates = 0;
  for (const Step& step : result.steps) {
    if (step.kind == Step::Kind::destroy) {
      ++destroys;
      EXPECT_NE(step.id, 1u);  // the 3g in use stays
    } else {
      ++creates;
      EXPECT_NE(step.instance.profile, three);
    }
  }
  EXPECT_EQ(destroys, 2);
  EXPECT_EQ(creates, 2);
  EXPECT_TRUE(legal(h100, result.result));
  EXPECT_EQ(counts_of(result.result),
            (ProfileCounts{{"1g.20gb", 1}, {"2g.20gb", 1}, {"3g.40gb", 1}}));
  // Room beside all three: one create, nothing destroyed.
  result = reconcile(h100, current, {{"3g.40gb", 1}, {"1g.10gb", 2}, {"1g.20gb", 1}}, false);
  ASSERT_TRUE(result.ok) << result.why;
  ASSERT_EQ(result.steps.size(), 1u);
  EXPECT_EQ(result.steps[0].kind, Step::Kind::create);
  EXPECT_EQ(result.steps[0].instance.start, 6);
  // 3g + 2g x2 fits only with the 3g on the right half: the one in use would have to move.
  result = reconcile(h100, current, {{"3g.40gb", 1}, {"2g.20gb", 2}}, false);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.why.find("GPU instance 1 (3g.40gb at slice 0) is in use"), std::string::npos)
      << result.why;

  // Already there: nothing to do.
  result = reconcile(h100, {{{three, 0}, 1, true}}, {{"3g.40gb", 1}}, false);
  ASSERT_TRUE(result.ok);
  EXPECT_TRUE(result.steps.empty());

  // A 7g needs the 3g in use gone: refused with its ID, done with force.
  result = reconcile(h100, current, {{"7g.80gb", 1}}, false);
  ASSERT_FALSE(result.ok);
  EXPECT_NE(result.why.find("GPU instance 1 (3g.40gb at slice 0) is in use"), std::string::npos)
      << result.why;
  result = reconcile(h100, current, {{"7g.80gb", 1}}, true);
  ASSERT_TRUE(result.ok) << result.why;
  EXPECT_EQ(result.steps.size(), 4u);
  EXPECT_EQ(result.steps.back().kind, Step::Kind::create);
}

// The seeds' mig-parted ConfigMap, as written there.
constexpr const char* kSeedPartedConfig = R"(version: v1
mig-configs:
  # 默认配置: 7 个 1g.10gb
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  # 混合配置: 1 个 3g.40gb + 2 个 2g.20gb
  mixed:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 1
        "2g.20gb": 2
  # 大实例配置
  big-instance:
    - devices: all
      mig-enabled: true
      mig-devices:
        "7g.80gb": 1
)";

TEST(MigPartedConfig, TheSeedsAndReferenceConfigsAreAcceptedAndFitAnA100With80GB) {
  const PartedConfig seeds = parse_parted_config(kSeedPartedConfig, "config.yaml");
  ASSERT_EQ(seeds.configs.size(), 3u);
  const GpuModel& a100 = model("A100-80GB");
  for (const auto& [name, entries] : seeds.configs) {
    ASSERT_EQ(entries.size(), 1u) << name;
    EXPECT_TRUE(entries[0].mig_enabled);
    EXPECT_TRUE(place(a100, entries[0].mig_devices).found) << name;
  }
  EXPECT_FALSE(seeds.configs.at("mixed")[0].all_devices);
  EXPECT_EQ(seeds.configs.at("mixed")[0].devices, std::vector<int>{0});
  EXPECT_EQ(entry_for(seeds.configs.at("mixed"), "mixed", 1, 0x20B210DE), nullptr);

  const PartedConfig reference = parse_parted_config(R"(version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  mixed:
    - device-filter: ["0x20B210DE"]   # optional PCI device+vendor id
      devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "2g.20gb": 2}
    - device-filter: "0x233010DE"
      devices: [0]
      mig-enabled: true
      mig-devices: {"1g.10gb+me": 1, "1g.10gb": 6}
)",
                                                     "reference.yaml");
  const auto& mixed = reference.configs.at("mixed");
  const PartedEntry* a100_entry = entry_for(mixed, "mixed", 0, 0x20B210DE);
  const PartedEntry* h100_entry = entry_for(mixed, "mixed", 0, 0x233010DE);
  ASSERT_NE(a100_entry, nullptr);
  ASSERT_NE(h100_entry, nullptr);
  EXPECT_EQ(a100_entry->mig_devices.at("2g.20gb"), 2);
  EXPECT_TRUE(place(model("H100-80GB"), h100_entry->mig_devices).found);
  EXPECT_FALSE(reference.configs.at("all-disabled")[0].mig_enabled);
}

TEST(MigPartedConfig, TheExamplesAreAcceptedAndEveryEntryFitsTheModelsItSelects) {
  const std::string folder = std::string(TESSERA_SOURCE_DIR) + "/examples/mig/";
  const PartedConfig seeds = parse_parted_config(
      read_text_file(folder + "seed-chapter-mig-parted.yaml"), "seed-chapter-mig-parted.yaml");
  EXPECT_EQ(seeds.configs.size(), 3u);
  const PartedConfig fleet =
      parse_parted_config(read_text_file(folder + "by-model.yaml"), "by-model.yaml");
  const std::vector<std::pair<std::uint32_t, const char*>> models = {{0x20B210DE, "A100-80GB"},
                                                                     {0x233010DE, "H100-80GB"},
                                                                     {0x233510DE, "H200"},
                                                                     {0x20B010DE, "A100-40GB"}};
  for (const auto& [device_id, key] : models) {
    const PartedEntry* entry =
        entry_for(fleet.configs.at("half-and-half"), "half-and-half", 0, device_id);
    ASSERT_NE(entry, nullptr) << key;
    const Plan plan = place(model(key), entry->mig_devices);
    EXPECT_TRUE(plan.found) << key << ": " << plan.why;
  }
}

TEST(MigPartedConfig, RefusalsCarryMigPartedsMessagesWithTheFileAndEntry) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"mig-configs: {}\n", "f.yaml: unable to parse with missing 'version' field"},
      {"version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}\n",
       "f.yaml: version: unknown version: v2"},
      {"version: v1\nmig-configs: {a: []}\n",
       "f.yaml: mig-configs.a: at least one entry in 'a' is required"},
      {"version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}\n",
       "f.yaml: mig-configs.a[0]: missing required field 'mig-devices' when 'mig-enabled' is "
       "true"},
      {"version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: "
       "{1g.10gb: 1}}]}\n",
       "f.yaml: mig-configs.a[0]: MIG devices included when 'mig-enabled' is false"},
      {"version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}\n",
       "f.yaml: mig-configs.a[0]: invalid string input for 'devices': some"},
      {"version: v1\nmig-configs: {a: [{devices: all}]}\n",
       "f.yaml: mig-configs.a[0]: missing required field: mig-enabled"},
      {"version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, colour: red}]}\n",
       "f.yaml: mig-configs.a[0]: unexpected field: colour"},
      {"version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: "
       "{1x.10gb: 1}}]}\n",
       "f.yaml: mig-configs.a[0]: error validating values in 'mig-devices' field: invalid "
       "format for '1x.10gb': error parsing '.' separated fields in MigProfile string: missing "
       "'g' from '%dg'"},
      {"version: v1\nmig-configs: {a: [{devices: [0, 0], mig-enabled: false}]}\n",
       "f.yaml: mig-configs.a[0].devices[1]: GPU 0 is listed twice"},
      {"version: v1\nmig-configs: {a: [{device-filter: 0xZZ, devices: all, mig-enabled: "
       "false}]}\n",
       "f.yaml: mig-configs.a[0].device-filter: unable to create DeviceID from string '0xZZ'"},
      {"version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: "
       "{1g.10gb: -1}}]}\n",
       "f.yaml: mig-configs.a[0]: error validating values in 'mig-devices' field: invalid count "
       "for '1g.10gb': -1"},
      {"version: v1\nmig-configs: [" + std::string(100, '[') + "\n", "nested more than 32 deep"},
  };
  for (const auto& [text, message] : cases) {
    try {
      parse_parted_config(text, "f.yaml");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const MigConfigError& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos)
          << error.what() << "\nwanted: " << message;
    }
  }
  // Two entries selecting one GPU: refused when that GPU's entry is looked up.
  const PartedConfig both = parse_parted_config(
      "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false}, {devices: [1], "
      "mig-enabled: false}]}\n",
      "f.yaml");
  EXPECT_NE(entry_for(both.configs.at("a"), "a", 0, 0), nullptr);
  EXPECT_THROW(entry_for(both.configs.at("a"), "a", 1, 0), MigConfigError);
}

TEST(MigPartedConfig, ProfileSpellingsFollowMigParted) {
  for (const char* good : {"1g.10gb", "1c.2g.10gb", "1g.5gb+me", "1g.24gb-me", "7g.141gb"}) {
    EXPECT_EQ(profile_format_error(good), "") << good;
  }
  for (const char* bad :
       {"", "1g", "g.10gb", "1g.10", "1g.10gb+", "1g.10gb+me,me", "1g.10gb+2x", "1.2.3.4"}) {
    EXPECT_NE(profile_format_error(bad), "") << bad;
  }
}

// --- tessera mig on the simulated GPU, as a user runs it

constexpr const char* kTwoGpus = "A100-80GB;H100";

struct MigMachine {
  ScratchDirectory scratch;
  std::string config = scratch.file("mig.yaml");
  Environment environment =
      unhooked(scratch, {{"TESSERA_SIM_DEVICES", kTwoGpus}, {"TESSERA_SIMULATE", "1"}});
  MigMachine() {
    std::FILE* file = std::fopen(config.c_str(), "w");
    std::fputs(kSeedPartedConfig, file);
    std::fputs("  off:\n    - devices: all\n      mig-enabled: false\n", file);
    std::fclose(file);
  }
  Finished mig(std::vector<std::string> arguments, const Environment& extra = {}) const {
    arguments.insert(arguments.begin(), {tessera(), "mig"});
    Environment settings = environment;
    for (const auto& [key, value] : extra) settings[key] = value;
    return run(arguments, settings);
  }
  // A process holding memory on GPU 0, until its stdin is closed.
  std::unique_ptr<Running> hold_gpu0() const {
    Environment settings = environment;
    settings["CUDA_VISIBLE_DEVICES"] = "0";
    return std::make_unique<Running>(std::vector<std::string>{worker(), "hold", "1048576"},
                                     settings);
  }
  Finished reset(int device) const {
    return run({tessera(), "simgpu", "reset", "--device", std::to_string(device)}, environment);
  }
};

int lines_with(const std::string& text, const std::string& part) {
  int count = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) {
    ++count;
  }
  return count;
}

TEST(MigCommand, ApplyWaitsForAResetThenMakesTheLayoutWithTheFewestChanges) {
  MigMachine machine;
  Finished done = machine.mig({"apply", "-f", machine.config, "-c", "mixed"});
  ASSERT_EQ(done.exit_code, 3) << done.out << done.err;  // MIG on waits for a reset
  EXPECT_NE(done.out.find("MIG mode on is pending"), std::string::npos) << done.out;
  done = machine.mig({"show"});
  EXPECT_NE(done.out.find("GPU 0: NVIDIA A100-SXM4-80GB (A100-80GB), MIG off (on after a reset)"),
            std::string::npos)
      << done.out;
  ASSERT_EQ(machine.reset(0).exit_code, 0);
  done = machine.mig({"apply", "-f", machine.config, "-c", "mixed"});
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(lines_with(done.out, "  create "), 3) << done.out;
  done = machine.mig({"show"});
  EXPECT_EQ(lines_with(done.out, " MIG-7e55e7a0-"), 3) << done.out;
  EXPECT_NE(done.out.find("|2g.20gb              |2g.20gb              |3g.40gb"),
            std::string::npos)
      << done.out;
  // The same layout again: nothing to do. A 7g: three destroyed, one made.
  done = machine.mig({"apply", "-f", machine.config, "-c", "mixed"});
  EXPECT_NE(done.out.find("nothing to change"), std::string::npos) << done.out;
  done = machine.mig({"apply", "-f", machine.config, "-c", "big-instance", "-d", "0"});
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_EQ(lines_with(done.out, "  destroy "), 3) << done.out;
  EXPECT_EQ(lines_with(done.out, "  create "), 1) << done.out;
  // Off again: instances go, then the mode, after a reset.
  done = machine.mig({"apply", "-f", machine.config, "-c", "off", "-d", "0"});
  EXPECT_EQ(done.exit_code, 3) << done.out << done.err;
  ASSERT_EQ(machine.reset(0).exit_code, 0);
  done = machine.mig({"show"});
  EXPECT_NE(done.out.find("(A100-80GB), MIG off\n"), std::string::npos) << done.out;
}

TEST(MigCommand, AFailedCreateRollsBackToTheLayoutItFound) {
  MigMachine machine;
  ASSERT_EQ(machine.mig({"apply", "-f", machine.config, "-c", "mixed", "-d", "0"}).exit_code, 3);
  ASSERT_EQ(machine.reset(0).exit_code, 0);
  ASSERT_EQ(machine.mig({"apply", "-f", machine.config, "-c", "mixed", "-d", "0"}).exit_code, 0);
  const std::string before = machine.mig({"show"}).out;
  // From 3g + 2g x2 to 1g x7: three destroyed, then the second create fails.
  Finished done = machine.mig({"apply", "-f", machine.config, "-c", "all-1g.10gb", "-d", "0"},
                              {{"TESSERA_SIM_FAIL", "nvmlDeviceCreateGpuInstance#2"}});
  EXPECT_EQ(done.exit_code, 1) << done.out << done.err;
  EXPECT_NE(done.out.find("failed: GPU 0: creating 1g.10gb at slice 1"), std::string::npos)
      << done.out;
  EXPECT_NE(done.out.find("rolled back"), std::string::npos) << done.out;
  const std::string after = machine.mig({"show"}).out;
  // The same instances at the same places (their IDs and UUIDs are new).
  auto shape = [](const std::string& show) {
    std::vector<std::string> rows;
    std::istringstream lines(show);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("GPU instance") != std::string::npos) rows.push_back(line.substr(18, 22));
      if (line.find("  |") == 0) rows.push_back(line);
    }
    std::sort(rows.begin(), rows.end());
    return rows;
  };
  EXPECT_EQ(shape(after), shape(before)) << before << "\n---\n" << after;
  EXPECT_EQ(lines_with(after, " MIG-7e55e7a0-"), 3) << after;
}

TEST(MigCommand, InstancesInUseAreKeptAndAResetIsRefusedWhileTheGpuIsBusy) {
  MigMachine machine;
  ASSERT_EQ(machine.mig({"apply", "-f", machine.config, "-c", "mixed", "-d", "0"}).exit_code, 3);
  const std::unique_ptr<Running> holder = machine.hold_gpu0();
  ASSERT_EQ(holder->read_line(), "result=0");
  Finished done = machine.reset(0);
  EXPECT_EQ(done.exit_code, 1);
  EXPECT_NE(done.err.find("GPU 0 is in use: stop its processes first"), std::string::npos)
      << done.err;
  holder->close_stdin();
  ASSERT_EQ(holder->wait(), 0);
  ASSERT_EQ(machine.reset(0).exit_code, 0);
  ASSERT_EQ(machine.mig({"apply", "-f", machine.config, "-c", "mixed", "-d", "0"}).exit_code, 0);
  // A process on the GPU now: its instances are in use, and a new layout is refused.
  const std::unique_ptr<Running> user = machine.hold_gpu0();
  ASSERT_EQ(user->read_line(), "result=0");
  done = machine.mig({"apply", "-f", machine.config, "-c", "big-instance", "-d", "0"});
  EXPECT_EQ(done.exit_code, 1) << done.out;
  EXPECT_NE(done.out.find("is in use, and 7g.80gb x1 has no room for it"), std::string::npos)
      << done.out;
  // --force asks the driver anyway: it refuses, and nothing is lost.
  done = machine.mig({"apply", "-f", machine.config, "-c", "big-instance", "-d", "0", "--force"});
  EXPECT_EQ(done.exit_code, 1) << done.out;
  EXPECT_NE(done.out.find("rolled back"), std::string::npos) << done.out;
  user->close_stdin();
  ASSERT_EQ(user->wait(), 0);
  EXPECT_EQ(lines_with(machine.mig({"show"}).out, " MIG-7e55e7a0-"), 3);
}

// The MIG devices `tessera mig show` lists: UUID -> (profile, GPU instance ID).
std::map<std::string, std::pair<std::string, std::string>> mig_devices_shown(
    const std::string& show) {
  std::map<std::string, std::pair<std::string, std::string>> devices;
  std::istringstream lines(show);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string gpu, instance, id, profile, slice, start, uuid;
    if (words >> gpu >> instance >> id >> profile >> slice >> start >> uuid && gpu == "GPU" &&
        instance == "instance" && uuid.rfind("MIG-", 0) == 0) {
      devices[uuid] = {profile, id};
    }
  }
  return devices;
}

// With a GPU laid out in MIG devices, CUDA (the simulated driver) no longer runs on the GPU
// as a whole but on each MIG device, named by its UUID as NVIDIA's driver takes them: a
// device of its GPU instance's memory and its compute instance's SMs, isolated from the
// others, inside which the hook's quotas hold as on a whole GPU.
TEST(MigDevice, CudaSeesEachInstanceAsADeviceOfItsOwnMemoryAndSmsAndTheHookQuotaHoldsInIt) {
  MigMachine machine;
  ASSERT_EQ(machine.mig({"apply", "-f", machine.config, "-c", "mixed", "-d", "0"}).exit_code, 3);
  ASSERT_EQ(machine.reset(0).exit_code, 0);
  ASSERT_EQ(machine.mig({"apply", "-f", machine.config, "-c", "mixed", "-d", "0"}).exit_code, 0);
  const auto devices = mig_devices_shown(machine.mig({"show"}).out);
  ASSERT_EQ(devices.size(), 3u);
  // The A100-80GB's 3g.40gb and 2g.20gb, as NVML reports them (sim_nvml_mig.cpp's table).
  const std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> expected = {
      {"3g.40gb", {40192ull << 20, 42}}, {"2g.20gb", {19968ull << 20, 28}}};
  auto on = [&](const std::string& visible) {
    Environment settings = machine.environment;
    settings["CUDA_VISIBLE_DEVICES"] = visible;
    return settings;
  };
  std::vector<std::string> two_g;
  for (const auto& [uuid, described] : devices) {
    const auto& [profile, instance_id] = described;
    const Finished info = run({worker(), "info"}, on(uuid));
    ASSERT_EQ(info.exit_code, 0) << uuid << info.out << info.err;
    EXPECT_EQ(info.number("device_count"), 1u) << uuid;
    EXPECT_EQ(info.number("device_total"), expected.at(profile).first) << uuid;
    EXPECT_EQ(info.number("device_sms"), expected.at(profile).second) << uuid;
    EXPECT_EQ(info.value("device_name"), "NVIDIA A100-SXM4-80GB MIG " + profile) << uuid;
    // The same device by a prefix of its UUID and as MIG-<GPU UUID>/<GI>/<CI>.
    EXPECT_EQ(run({worker(), "info"}, on(uuid.substr(0, 36))).number("device_total"),
              expected.at(profile).first);
    const std::string by_ids = "MIG-" + simulated_gpu_uuid(0) + "/" + instance_id + "/0";
    EXPECT_EQ(run({worker(), "info"}, on(by_ids)).number("device_total"),
              expected.at(profile).first)
        << by_ids;
    if (profile == "2g.20gb") two_g.push_back(uuid);
  }
  ASSERT_EQ(two_g.size(), 2u);
  // Unset, CUDA enumerates the three MIG devices and the H100 (GPU 1 is not in MIG mode).
  Environment everything = machine.environment;
  EXPECT_EQ(run({worker(), "info"}, everything).number("device_count"), 4u);
  // Named as a whole, a GPU in MIG mode is no CUDA device; nor is an instance that is not.
  for (const std::string& none :
       {simulated_gpu_uuid(0), "MIG-" + simulated_gpu_uuid(0) + "/9/0", std::string("MIG-ffff")}) {
    EXPECT_EQ(run({worker(), "init"}, on(none)).value("result"), "100") << none;
  }

  // Memory: a process on one 2g.20gb holding 15 GiB leaves the other's untouched, and its
  // own instance only what is left of 19.5 GiB. Fill allocates in 256 MiB chunks.
  constexpr std::uint64_t kChunk = 256ull << 20, kHeld = 15ull << 30;
  const std::uint64_t instance_bytes = 19968ull << 20;
  Environment first = on(two_g[0]);
  Running holder({worker(), "hold", std::to_string(kHeld)}, first);
  ASSERT_EQ(holder.read_line(), "result=0");
  const Finished other = run({worker(), "fill", std::to_string(kChunk)}, on(two_g[1]));
  const std::uint64_t context = run({worker(), "info"}, on(two_g[1])).number("driver_used");
  EXPECT_LE(other.number("allocated"), instance_bytes - context);
  EXPECT_GT(other.number("allocated") + kChunk, instance_bytes - context);
  const Finished same = run({worker(), "fill", std::to_string(kChunk)}, first);
  EXPECT_LE(same.number("allocated"), instance_bytes - kHeld - 2 * context);
  EXPECT_GT(same.number("allocated") + kChunk, instance_bytes - kHeld - 2 * context);
  // The instance's process shows in NVML on the GPU, so a new layout is refused while it runs.
  Finished refused = machine.mig({"apply", "-f", machine.config, "-c", "big-instance", "-d", "0"});
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_NE(refused.out.find("is in use"), std::string::npos) << refused.out;
  // Killed with -9, the holder's 15 GiB come back to its instance, as the driver frees them.
  holder.kill_hard();
  ASSERT_EQ(holder.wait(), 128 + SIGKILL);
  const Finished after = run({worker(), "fill", std::to_string(kChunk)}, first);
  EXPECT_GT(after.number("allocated") + kChunk, instance_bytes - context);

  // The hook's memory quota inside a MIG device: 4 GiB of the 19.5.
  Environment limited = first;
  limited["LD_PRELOAD"] = build_path("lib/libtessera-cuda.so");
  limited[contract::kMemoryLimitVariable] = "4GiB";
  const Finished quota = run({worker(), "fill", std::to_string(kChunk)}, limited);
  EXPECT_EQ(quota.number("total"), 4ull << 30);
  EXPECT_LE(quota.number("allocated"), 4ull << 30);
  EXPECT_GT(quota.number("allocated") + kChunk, 4ull << 30);
}

// MIG instances have SMs of their own: two processes saturating two instances each keep
// theirs busy, where on one GPU they would time-slice to half each. Judged, as every timing
// test here, against the share of the window the host let each worker run.
TEST(MigDevice, KernelsOnTwoInstancesRunSideBySide) {
  MigMachine machine;
  ASSERT_EQ(machine.mig({"apply", "-f", machine.config, "-c", "mixed", "-d", "0"}).exit_code, 3);
  ASSERT_EQ(machine.reset(0).exit_code, 0);
  ASSERT_EQ(machine.mig({"apply", "-f", machine.config, "-c", "mixed", "-d", "0"}).exit_code, 0);
  std::vector<std::unique_ptr<Running>> workers;
  for (const auto& [uuid, described] : mig_devices_shown(machine.mig({"show"}).out)) {
    if (described.first != "2g.20gb") continue;
    Environment settings = machine.environment;
    settings["CUDA_VISIBLE_DEVICES"] = uuid;
    workers.push_back(std::make_unique<Running>(
        std::vector<std::string>{worker(), "saturate", "plain", "long@5ms", "1.5"}, settings));
  }
  ASSERT_EQ(workers.size(), 2u);
  std::vector<Finished> done;
  for (auto& running : workers) done.push_back(running->finish());
  constexpr std::uint64_t kSettle = 200'000'000, kWindow = 1'000'000'000;
  std::uint64_t from = 0;
  for (const Finished& one : done) {
    ASSERT_EQ(one.exit_code, 0) << one.out;
    from = std::max(from, one.number("begin_ns") + kSettle);
  }
  setenv("TESSERA_SIM_STATE", machine.scratch.file("simgpu").c_str(), 1);
  setenv("TESSERA_SIM_DEVICES", kTwoGpus, 1);
  sim::Machine record;
  ErrorText error;
  ASSERT_TRUE(record.attach(error)) << error.text;
  for (const Finished& one : done) {
    std::uint64_t busy = 0;
    for (int device = 0; device < sim::kSimDevices; ++device) {
      busy +=
          record.busy(device, static_cast<std::int32_t>(one.number("pid")), from, from + kWindow)
              .process_ns;
    }
    const double share = 100.0 * static_cast<double>(busy) / kWindow;
    const double allowed = 100.0 * one.host().allowed(from, from + kWindow);
    EXPECT_LE(share, 100.5);
    EXPECT_GE(share, allowed - 10) << "the host let it run " << allowed << " % of the window";
  }
}

TEST(MigCommand, BadConfigsAndArgumentsAreRefusedByName) {
  MigMachine machine;
  Finished done = machine.mig({"apply", "-f", machine.config, "-c", "nope"});
  EXPECT_EQ(done.exit_code, 2);
  EXPECT_NE(done.err.find("has no config 'nope' (it has: all-1g.10gb, big-instance, mixed, off)"),
            std::string::npos)
      << done.err;
  const std::string bad = machine.scratch.file("bad.yaml");
  std::FILE* file = std::fopen(bad.c_str(), "w");
  std::fputs("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n",
             file);
  std::fclose(file);
  done = machine.mig({"plan", "-f", bad, "--model", "A100-80GB"});
  EXPECT_EQ(done.exit_code, 2);
  EXPECT_NE(done.err.find("bad.yaml: mig-configs.a[0]: missing required field 'mig-devices'"),
            std::string::npos)
      << done.err;
  done = machine.mig({"plan", "-f", machine.config, "--model", "T4"});
  EXPECT_EQ(done.exit_code, 2);
  EXPECT_NE(done.err.find("--model T4: not a MIG GPU Tessera knows"), std::string::npos);
  done = machine.mig({"apply", "-f", machine.config, "-c", "mixed", "-d", "7"});
  EXPECT_EQ(done.exit_code, 2);
  EXPECT_NE(done.err.find("--device 7: this machine has 2 GPU(s)"), std::string::npos) << done.err;
  // The seeds' mixed config names GPU 0 only: on GPU 1 alone it has nothing to do, and says so.
  done = machine.mig({"plan", "-f", machine.config, "-c", "mixed", "-d", "1"});
  EXPECT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.out.find("config mixed selects none of this machine's MIG-capable GPUs"),
            std::string::npos)
      << done.out;
  done = machine.mig({"advise", "--model", "H200", "--job", "three"});
  EXPECT_EQ(done.exit_code, 2);
  EXPECT_NE(done.err.find("--job 'three': write COUNTxMEMORY"), std::string::npos) << done.err;
  // The seeds' layouts on an H100 NVL: their A100/H100 profile names are not its own.
  done = machine.mig({"plan", "-f", machine.config, "-c", "mixed", "--model", "H100-NVL"});
  EXPECT_EQ(done.exit_code, 1);
  EXPECT_NE(done.out.find("2g.20gb is not a MIG profile of H100-NVL (its profiles: 1g.12gb"),
            std::string::npos)
      << done.out;
}

// One config for two models, its entries chosen by PCI device ID: each GPU gets its own.
TEST(MigCommand, DeviceFiltersGiveEachModelItsOwnLayout) {
  MigMachine machine;
  machine.environment["TESSERA_SIM_DEVICES"] = "A100-80GB;H200";
  const std::string fleet = std::string(TESSERA_SOURCE_DIR) + "/examples/mig/by-model.yaml";
  const std::vector<std::string> apply = {"apply", "-f", fleet, "-c", "half-and-half"};
  ASSERT_EQ(machine.mig(apply).exit_code, 3);
  ASSERT_EQ(machine.reset(0).exit_code, 0);
  ASSERT_EQ(machine.reset(1).exit_code, 0);
  const Finished done = machine.mig(apply);
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  const std::string shown = machine.mig({"show"}).out;
  EXPECT_EQ(lines_with(shown, " 1g.10gb "), 4) << shown;
  EXPECT_EQ(lines_with(shown, " 3g.40gb "), 1) << shown;
  EXPECT_EQ(lines_with(shown, " 1g.18gb "), 4) << shown;
  EXPECT_EQ(lines_with(shown, " 3g.71gb "), 1) << shown;
}

TEST(MigAdvisor, ThePlacedJobsFitTheirInstancesAndEveryLayoutIsLegal) {
  const GpuModel& a100 = model("A100-80GB");
  std::vector<Job> jobs;
  for (int i = 0; i < 3; ++i) jobs.push_back({"small", 9 * 1024, 1});
  jobs.push_back({"medium", 35 * 1024, 3});
  jobs.push_back({"large", 70 * 1024, 1});
  jobs.push_back({"huge", 100 * 1024, 1});
  const Advice advice = advise(a100, jobs, 2);
  ASSERT_EQ(advice.gpus.size(), 2u);
  std::size_t placed = 0;
  for (const GpuAdvice& gpu : advice.gpus) {
    EXPECT_TRUE(legal(a100, gpu.layout));
    for (const auto& [job, profile] : gpu.placed) {
      const auto found = std::find_if(jobs.begin(), jobs.end(),
                                      [&](const Job& candidate) { return candidate.name == job; });
      EXPECT_GE(profile->memory_mib, found->memory_mib) << job << " on " << profile->name;
      EXPECT_GE(profile->compute_slices, found->compute_slices) << job << " on " << profile->name;
    }
    placed += gpu.placed.size();
  }
  EXPECT_EQ(placed, 5u);  // all but the one larger than the GPU
  ASSERT_EQ(advice.unplaced.size(), 1u);
  EXPECT_EQ(advice.unplaced[0], "huge (larger than any A100-80GB MIG profile)");
  // One GPU for seven 1g jobs: the 1g x7 layout, nothing idle.
  const Advice sevens = advise(a100, std::vector<Job>(7, Job{"tiny", 1024, 1}), 1);
  ASSERT_EQ(sevens.gpus.size(), 1u);
  EXPECT_EQ(counts_of(sevens.gpus[0].layout), (ProfileCounts{{"1g.10gb", 7}}));
  EXPECT_TRUE(sevens.gpus[0].idle.empty());
  EXPECT_TRUE(sevens.unplaced.empty());
}

TEST(MigCommand, AdviseReadsAPodListOfMigAndHamiPods) {
  MigMachine machine;
  const std::string pods = machine.scratch.file("pods.json");
  std::FILE* file = std::fopen(pods.c_str(), "w");
  std::fputs(R"({"kind": "List", "items": [
    {"kind": "Pod", "metadata": {"name": "mig-pod", "namespace": "a", "uid": "1"},
     "spec": {"containers": [{"name": "c",
       "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-1g.10gb.me": "1"}}}]}},
    {"kind": "Pod", "metadata": {"name": "hami", "namespace": "a", "uid": "2"},
     "spec": {"containers": [{"name": "c", "resources": {"limits":
       {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 15000, "nvidia.com/gpucores": 10}}}]}},
    {"kind": "Pod", "metadata": {"name": "cpu", "namespace": "a", "uid": "3"},
     "spec": {"containers": [{"name": "c"}]}}]})",
             file);
  std::fclose(file);
  // 3g (4 memory slices) + 1g.10gb+me (1) + two 1g.20gb (2 each): 9 slices, two GPUs.
  Finished done = machine.mig({"advise", "--model", "A100-80GB", "--pods", pods, "--gpus", "2"});
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_NE(done.out.find("a/mig-pod x1 on 3g.40gb"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("a/mig-pod x1 on 1g.10gb+me"), std::string::npos) << done.out;
  // 15000 MiB and 10 % of the cores: a 1g.20gb (two memory slices, one compute slice) each.
  EXPECT_NE(done.out.find("a/hami x2 on 1g.20gb"), std::string::npos) << done.out;
  // A profile the model lacks, and a file that is not JSON, are refused by name.
  file = std::fopen(pods.c_str(), "w");
  std::fputs(R"({"kind": "Pod", "metadata": {"name": "p", "namespace": "a", "uid": "1"},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-9g.1tb": 1}}}]}})",
             file);
  std::fclose(file);
  done = machine.mig({"advise", "--model", "A100-80GB", "--pods", pods});
  EXPECT_EQ(done.exit_code, 2);
  EXPECT_NE(done.err.find("pod a/p: nvidia.com/mig-9g.1tb: no A100-80GB profile of that name"),
            std::string::npos)
      << done.err;
  file = std::fopen(pods.c_str(), "w");
  std::fputs("{not json", file);
  std::fclose(file);
  done = machine.mig({"advise", "--model", "A100-80GB", "--pods", pods});
  EXPECT_EQ(done.exit_code, 2);
  EXPECT_NE(done.err.find("pods.json: not JSON"), std::string::npos) << done.err;
}

TEST(MigCommand, AdviseWritesALayoutThatPlanAccepts) {
  MigMachine machine;
  const Finished done = machine.mig(
      {"advise", "--model", "H200", "--job", "4x15GiB", "--job", "1x60GiB@3", "--gpus", "1"});
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  const std::size_t yaml = done.out.find("version: v1");
  ASSERT_NE(yaml, std::string::npos) << done.out;
  const std::string advised = machine.scratch.file("advised.yaml");
  std::FILE* file = std::fopen(advised.c_str(), "w");
  std::fputs(done.out.substr(yaml).c_str(), file);
  std::fclose(file);
  const Finished planned = machine.mig({"plan", "-f", advised, "--model", "H200"});
  EXPECT_EQ(planned.exit_code, 0) << planned.out << planned.err;
  EXPECT_NE(planned.out.find("3g.71gb x1"), std::string::npos) << planned.out;
}

}  // namespace
}  // namespace tessera::test
