// Where the node agent's configs come from, and which one a node serves: a directory of them
// (a ConfigMap), one file, or NVIDIA's default. Each is read by config_schema.cpp.
#include "node/config.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "contract/annotations.h"

namespace tessera::node {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMostConfigs = 256;

// The configs a directory holds, in name order: regular files (ConfigMap links followed), not
// the kubelet's bookkeeping (..data and its timestamped directories). One more than
// kMostConfigs at most: the caller judges a directory with too many.
std::vector<fs::path> config_files_in(const std::string& directory, std::error_code& error) {
  std::vector<fs::path> files;
  fs::directory_iterator entries(directory, error);
  for (; !error && entries != fs::directory_iterator() && files.size() <= kMostConfigs;
       entries.increment(error)) {
    const std::string name = entries->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code kind_error;
    if (fs::is_regular_file(entries->path(), kind_error)) files.push_back(entries->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

ConfigSet read_config_directory(const std::string& directory) {
  ConfigSet set;
  std::error_code error;
  const std::vector<fs::path> files = config_files_in(directory, error);
  if (error) throw ConfigError(fmt::format("{}: cannot be listed: {}", directory, error.message()));
  if (files.size() > kMostConfigs) {
    throw ConfigError(fmt::format("{}: more than {} configs", directory, kMostConfigs));
  }
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    try {
      set.configs[name] = parse_plugin_config(
          base::read_file_bounded(file.string(), kMostConfigBytes), file.string(), name);
    } catch (const ConfigError& refused) {
      set.refused[name] = refused.what();
    }
  }
  return set;
}

std::string config_source_fingerprint(const std::string& directory, const std::string& file) {
  std::string text;
  auto add = [&text](const fs::path& path) {
    std::ifstream input(path, std::ios::binary);
    std::string content(kMostConfigBytes + 1, '\0');
    input.read(content.data(), static_cast<std::streamsize>(content.size()));
    content.resize(static_cast<std::size_t>(input.gcount()));
    text += path.filename().string() + "\n" + content + "\n";
  };
  if (!file.empty()) add(file);
  if (!directory.empty()) {
    std::error_code unlisted;  // a directory that cannot be listed holds nothing to compare
    for (const fs::path& path : config_files_in(directory, unlisted)) add(path);
  }
  return text;
}

ConfigSet read_config_file(const std::string& path, const std::string& name) {
  ConfigSet set;
  try {
    set.configs[name] =
        parse_plugin_config(base::read_file_bounded(path, kMostConfigBytes), path, name);
  } catch (const ConfigError& refused) {
    set.refused[name] = refused.what();
  }
  return set;
}

PluginConfig choose_config(const ConfigSet& set, const ConfigChoice& choice) {
  auto named = [&](const std::string& name, const std::string& because) -> PluginConfig {
    if (const auto found = set.configs.find(name); found != set.configs.end()) return found->second;
    if (const auto refused = set.refused.find(name); refused != set.refused.end()) {
      throw ConfigError(refused->second);
    }
    std::string names;
    for (const auto& [known, config] : set.configs) names += (names.empty() ? "" : ", ") + known;
    throw ConfigError(fmt::format("{} names config '{}', which does not exist (configs: {})",
                                  because, name.substr(0, 200), names.empty() ? "none" : names));
  };
  if (!choice.label.empty())
    return named(choice.label, std::string("the node label ") + contract::kConfigLabel);
  if (!choice.fallback.empty()) return named(choice.fallback, "--config");
  if (set.configs.size() + set.refused.size() == 1) {
    if (!set.refused.empty()) throw ConfigError(set.refused.begin()->second);
    return set.configs.begin()->second;
  }
  if (set.configs.size() + set.refused.size() > 1) {
    throw ConfigError(
        "there are several configs and neither the node label nvidia.com/device-plugin.config "
        "nor --config chooses one");
  }
  return default_plugin_config();
}

}  // namespace tessera::node
