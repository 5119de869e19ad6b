// The node agent's configs: NVIDIA's v1, the GPU-sharing guide's and Tessera's slices, read or
// refused with NVIDIA's messages, and named configs from a directory.
#include "node_fixtures.h"

namespace tessera::test {
namespace {

// Refused, naming `field`, with `message` in the reason.
void expect_refused(const std::string& yaml, const std::string& field, const std::string& message) {
  try {
    parse_plugin_config(yaml, "/etc/test/config.yaml");
    ADD_FAILURE() << "accepted:\n" << yaml;
  } catch (const ConfigError& refused) {
    const std::string why = refused.what();
    EXPECT_NE(why.find("/etc/test/config.yaml"), std::string::npos) << why;
    EXPECT_NE(why.find(field), std::string::npos) << "field " << field << " not named: " << why;
    EXPECT_NE(why.find(message), std::string::npos) << "expected '" << message << "' in: " << why;
  }
}

TEST(NodeConfig, EveryNvidiaAndSeedExampleGivesNvidiasResourcesAndIds) {
  const Inventory two = machine(2);
  const std::vector<int> both = {0, 1};
  struct Case {
    const char* file;
    std::map<std::string, std::set<std::string>> expected;
  };
  const std::set<std::string> whole = {simulated_gpu_uuid(0), simulated_gpu_uuid(1)};
  const Case cases[] = {
      {"nvidia-flags.yaml", {{"nvidia.com/gpu", whole}}},
      {"nvidia-time-slicing.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 10)}}},
      {"nvidia-time-slicing-renamed.yaml",
       {{"nvidia.com/gpu.shared", simulated_replica_ids(both, 10)}}},
      {"nvidia-fail-requests.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 10)}}},
      {"seed-any.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 4)}}},
      // mixed, and no GPU has MIG on: whole GPUs shared 8 ways; the MIG resources match nothing.
      {"seed-a100-40gb.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 8)}}},
      {"seed-tesla-t4.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 4)}}},
      {"seed-chapter-time-slicing.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 4)}}},
      {"seed-chapter-mig.yaml", {{"nvidia.com/gpu", whole}}},
      {"tessera-slices.yaml", {{"nvidia.com/gpu", simulated_replica_ids(both, 4)}}},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.file);
    const PluginConfig config =
        parse_plugin_config(read_text_file(example(test.file)), example(test.file));
    EXPECT_EQ(resources_of(build_resource_map(two, config)), test.expected);
  }
  // Every file in the folder is in the table above, or the MPS one.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(example("")))
    files += entry.path().extension() == ".yaml";
  EXPECT_EQ(files, static_cast<int>(std::size(cases)) + 2);  // + nvidia-mps, partly-shared
}

TEST(NodeConfig, TheSeedsMigStrategySpellingIsTheFlagsAndAContradictionIsRefused) {
  const PluginConfig config =
      parse_plugin_config(read_text_file(example("seed-chapter-mig.yaml")), "chapter");
  EXPECT_EQ(config.flags.mig_strategy, MigStrategy::single);
  expect_refused("version: v1\nflags: {migStrategy: mixed}\nsharing: {mig: {strategy: single}}\n",
                 "sharing.mig.strategy", "contradicts flags.migStrategy");
  expect_refused("sharing: {mig: {strategy: some}}\n", "flags.migStrategy",
                 "invalid --mig-strategy option: some");
}

TEST(NodeConfig, TheTimeSliceIsOneOfNvidiasFourAndOnlyWhenAsked) {
  EXPECT_EQ(parse_plugin_config("flags: {computeTimeslice: long}", "long").flags.compute_timeslice,
            3);
  EXPECT_EQ(
      parse_plugin_config("flags: {computeTimeslice: default}", "reset").flags.compute_timeslice,
      0);
  expect_refused("flags: {computeTimeslice: fast}\n", "flags.computeTimeslice",
                 "invalid time slice: fast (one of: default, short, medium, long)");
  expect_refused("flags: {computeTimeslice: [1]}\n", "flags.computeTimeslice", "");
}

TEST(NodeConfig, NvidiasDefaultsFillWhatAConfigLeavesOut) {
  const PluginConfig config = parse_plugin_config("version: v1\n", "minimal");
  EXPECT_EQ(config.flags.mig_strategy, MigStrategy::none);
  EXPECT_TRUE(config.flags.fail_on_init_error);
  EXPECT_TRUE(config.flags.device_list.envvar);
  EXPECT_FALSE(config.flags.device_list.volume_mounts);
  EXPECT_EQ(config.flags.device_id, DeviceIdStrategy::uuid);
  EXPECT_FALSE(config.flags.pass_device_specs);
  EXPECT_EQ(config.flags.nvidia_driver_root, "/");
  EXPECT_EQ(config.strategy(), SharingStrategy::none);
  EXPECT_EQ(config.flags.compute_timeslice, -1);  // the GPUs' time slice is left alone
  // An empty version is v1; an empty file is the default config.
  EXPECT_NO_THROW(parse_plugin_config("version: \"\"\n", "empty version"));
  EXPECT_EQ(parse_plugin_config("", "empty").strategy(), SharingStrategy::none);
  // JSON is YAML too, as NVIDIA's reader takes it.
  const PluginConfig json = parse_plugin_config(
      R"({"version":"v1","sharing":{"timeSlicing":{"resources":[{"name":"nvidia.com/gpu","replicas":3}]}}})",
      "json");
  EXPECT_EQ(json.time_slicing.resources.at(0).replicas, 3);
  // MPS keeps NVIDIA's historical default: one replica a request.
  EXPECT_TRUE(parse_plugin_config(read_text_file(example("nvidia-mps.yaml")), "mps")
                  .mps.fail_requests_greater_than_one);
  // A name without the prefix gets it, as NVIDIA's NewResourceName does.
  EXPECT_EQ(parse_plugin_config("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}",
                                "short")
                .time_slicing.resources.at(0)
                .name,
            "nvidia.com/gpu");
}

TEST(NodeConfig, InvalidConfigsAreRefusedWithNvidiasMessages) {
  expect_refused("version: v2\n", "version", "unknown version: v2");
  expect_refused("sharing: {timeSlicing: {}}\n", "sharing.timeSlicing", "no resources specified");
  expect_refused("sharing: {timeSlicing: {resources: []}}\n", "sharing.timeSlicing.resources",
                 "no resources specified");
  expect_refused("sharing: {timeSlicing: {resources: [{replicas: 2}]}}\n",
                 "sharing.timeSlicing.resources[0]", "no resource name specified");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}\n",
                 "sharing.timeSlicing.resources[0]", "no replicas specified");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}\n",
                 "sharing.timeSlicing.resources[0].replicas", "number of replicas must be >= 2");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: -3}]}}\n",
                 "replicas", "number of replicas must be >= 2");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: some}]}}\n",
      "devices", "devices set as 'some' but the only valid string input is 'all'");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: 0}]}}\n",
      "devices", "devices set as '0' but a count of devices must be > 0");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: "
      "[GPU-x]}]}}\n",
      "devices[0]", "unsupported type for device in devices list");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: \"nvidia.com/GPU!\", replicas: 2}]}}\n", "name",
      "incorrect format for resource name 'nvidia.com/GPU!'");
  expect_refused("flags: {plugin: {deviceListStrategy: carrier-pigeon}}\n",
                 "flags.plugin.deviceListStrategy",
                 "invalid --device-list-strategy option: invalid strategy: carrier-pigeon");
  expect_refused("flags: {plugin: {deviceIDStrategy: serial}}\n", "flags.plugin.deviceIDStrategy",
                 "invalid --device-id-strategy option: serial");
  expect_refused(
      "flags: {migStrategy: mixed}\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: "
      "2}]}}\n"
      "",
      "flags.migStrategy", "using --mig-strategy=mixed is not supported with MPS");
  expect_refused("sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n",
                 "flags.mpsRoot", "using MPS requires --mps-root to be specified");
  expect_refused("health: {eventTypes: [EventTypeNothing]}\n", "health.eventTypes[0]",
                 "invalid event type: EventTypeNothing");
  expect_refused("health: {ignoredXIDs: [79], criticalXIDs: [79]}\n", "health.criticalXIDs",
                 "XID 79 is in both ignored and critical lists");
}

TEST(NodeConfig, UnknownFieldsWrongTypesAndContradictionsAreRefusedNamingFieldAndValue) {
  expect_refused(
      "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicsa: 4}]}}\n",
      "sharing.timeSlicing.resources[0].replicsa", "unknown field");
  expect_refused("flags: {migStratgy: none}\n", "flags.migStratgy", "unknown field (known here:");
  expect_refused("verison: v1\n", "verison", "unknown field");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: \"4\"}]}}\n",
                 "replicas", "must be a whole number, not '4'");
  expect_refused("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4.5}]}}\n",
                 "replicas", "must be a whole number, not '4.5'");
  expect_refused("flags: {failOnInitError: maybe}\n", "flags.failOnInitError",
                 "must be true or false, not 'maybe'");
  expect_refused("flags: {failOnInitError: \"true\"}\n", "flags.failOnInitError",
                 "must be true or false");
  expect_refused("flags: [a, b]\n", "flags", "must be a mapping, not a list");
  expect_refused("flags: {mpsRoot: 12}\n", "flags.mpsRoot", "must be a string, not 12");
  expect_refused("version: v1\nversion: v1\n", "version", "is given twice");
  expect_refused(
      "sharing:\n  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
      "  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\nflags: {mpsRoot: /run/mps}\n",
      "sharing", "timeSlicing and mps are both set");
  expect_refused(
      "sharing:\n  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
      "  slices: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
      "sharing.slices", "nvidia.com/gpu is also shared by timeSlicing");
  expect_refused(
      "sharing: {slices: {resources: [{name: nvidia.com/gpu, replicas: 4, memoryPerSlice: "
      "8XB}]}}\n",
      "memoryPerSlice", "'8XB' is not a size");
  expect_refused(
      "sharing: {slices: {resources: [{name: nvidia.com/gpu, replicas: 4, coresPerSlice: 101}]}}\n",
      "coresPerSlice", "101 is out of range (1 to 100)");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, memoryPerSlice: "
      "1GiB}]}}\n",
      "memoryPerSlice", "unknown field");
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}, "
      "{name: nvidia.com/gpu, replicas: 3}]}}\n",
      "resources[1]", "resource nvidia.com/gpu is listed twice");
  expect_refused("version: [v1\n", "", "not YAML");
}

TEST(NodeConfig, HostileConfigsAreRefusedBeforeTheyCanHurt) {
  // Nesting that would overflow a recursive parser's stack.
  expect_refused(std::string(100000, '[') + std::string(100000, ']'), "",
                 "nested more than 32 deep");
  // Larger than any config.
  expect_refused("# " + std::string(kMostConfigBytes, 'x') + "\n", "", "larger than 256 KiB");
  // Aliases that multiply a small file into a huge tree.
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char name = 'b'; name <= 'j'; ++name) {
    bomb += std::string(1, name) + ": &" + name + " [*" + char(name - 1) + ", *" + char(name - 1) +
            ", *" + char(name - 1) + ", *" + char(name - 1) + ", *" + char(name - 1) + "]\n";
  }
  expect_refused(
      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: [0]}]}}\n" +
          bomb,
      "", "unknown field");
  expect_refused("imex: {channelIDs: " + std::string("[1,") + std::string(300000, ' ') + "2]}\n",
                 "", "larger than 256 KiB");
  // Not text at all.
  const std::string binary("\x00\xff\xfe\x01\x7f", 5);
  EXPECT_THROW(parse_plugin_config(binary, "binary"), ConfigError);
}

TEST(NodeConfig, NamedConfigsComeFromADirectoryMountedAsAConfigMapIs) {
  ScratchDirectory scratch;
  // A ConfigMap volume: ..data links to a timestamped directory, each key links through it.
  const std::string data = scratch.file("..2026_12_03_10_00_00.000000001");
  fs::create_directory(data);
  std::ofstream(data + "/any") << read_text_file(example("seed-any.yaml"));
  std::ofstream(data + "/tesla-t4") << read_text_file(example("seed-tesla-t4.yaml"));
  std::ofstream(data + "/broken")
      << "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}\n";
  fs::create_directory_symlink(data, scratch.file("..data"));
  for (const char* key : {"any", "tesla-t4", "broken"}) {
    fs::create_symlink(std::string("..data/") + key, scratch.file(key));
  }
  const ConfigSet set = read_config_directory(scratch.path());
  EXPECT_EQ(set.configs.size(), 2u);
  ASSERT_EQ(set.refused.count("broken"), 1u);
  EXPECT_NE(set.refused.at("broken").find("no replicas specified"), std::string::npos);

  EXPECT_EQ(choose_config(set, {"tesla-t4", "any"}).name, "tesla-t4");  // the label wins
  EXPECT_EQ(choose_config(set, {"", "any"}).name, "any");               // then --config
  try {
    choose_config(set, {"a100-80gb", "any"});
    ADD_FAILURE() << "a missing config was chosen";
  } catch (const ConfigError& refused) {
    EXPECT_NE(std::string(refused.what())
                  .find("nvidia.com/device-plugin.config names config 'a100-80gb'"),
              std::string::npos)
        << refused.what();
  }
  try {
    choose_config(set, {"broken", ""});
    ADD_FAILURE() << "a refused config was chosen";
  } catch (const ConfigError& refused) {
    EXPECT_NE(std::string(refused.what()).find("no replicas specified"), std::string::npos);
  }
  EXPECT_THROW(choose_config(set, {"", ""}), ConfigError);  // several, and nothing chooses
  // One config and nothing choosing: that one; none at all: NVIDIA's default.
  const ConfigSet single = read_config_file(example("seed-any.yaml"), "default");
  EXPECT_EQ(choose_config(single, {"", ""}).time_slicing.resources.at(0).replicas, 4);
  EXPECT_EQ(choose_config(ConfigSet{}, {"", ""}).strategy(), SharingStrategy::none);
}

TEST(NodeConfig, ASourcesFingerprintChangesWithAnEditAndNotWithTheKubeletsBookkeeping) {
  ScratchDirectory scratch;
  std::ofstream(scratch.file("any")) << "version: v1\n";
  const std::string before = config_source_fingerprint(scratch.path(), "");
  std::ofstream(scratch.file("..data_tmp")) << "the kubelet's";  // dot files are not configs
  EXPECT_EQ(config_source_fingerprint(scratch.path(), ""), before);
  std::ofstream(scratch.file("any")) << "version: v1\nflags: {}\n";
  const std::string edited = config_source_fingerprint(scratch.path(), "");
  EXPECT_NE(edited, before);
  std::ofstream(scratch.file("second")) << "version: v1\n";
  EXPECT_NE(config_source_fingerprint(scratch.path(), ""), edited);
  // A file larger than any config is read only as far as a config may go; one gone, or a
  // directory that is not there, is no error.
  std::ofstream(scratch.file("huge")) << std::string(kMostConfigBytes + 4096, 'x');
  EXPECT_LT(config_source_fingerprint(scratch.path(), "").size(), 2 * kMostConfigBytes);
  EXPECT_EQ(config_source_fingerprint(scratch.file("missing"), ""), "");
}

}  // namespace
}  // namespace tessera::test
