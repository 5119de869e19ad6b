#include "node/metrics.h"

#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "common/clock.h"
#include "common/limits.h"
#include "common/priority.h"
#include "kube/json_input.h"
#include "ledger/ledger.h"

namespace tessera::node {
namespace {

namespace fs = std::filesystem;

// One metric family: its help and type, then its samples.
class Family {
 public:
  Family(std::string& out, const char* name, const char* type, const char* help)
      : out_(out), name_(name) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::string& labels, double value) {
    out_ += fmt::format("{}{{{}}} {}\n", name_, labels, value);
  }
  void sample(double value) { out_ += fmt::format("{} {}\n", name_, value); }

 private:
  std::string& out_;
  const char* name_;
};

struct Group {
  std::string directory, labels;
  std::vector<int> gpus;  // the inventory's indices, by the container's ordinal
  std::vector<ledger::DeviceUsage> usage;
  Priority priority = Priority::none;
  int members = 0;
  std::string damage;
};

std::vector<Group> read_groups(const std::string& root, const Inventory& inventory) {
  std::vector<Group> groups;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    Group group;
    group.directory = entry.path().filename().string();
    nlohmann::json owner = nlohmann::json::object();
    try {
      std::ifstream input(entry.path() / "owner.json");
      std::string text((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
      if (text.size() < 65536) owner = kube::parse_outside_json(text);
    } catch (const std::exception&) {
    }
    auto field = [&](const char* name) {
      return owner.is_object() && owner.contains(name) && owner[name].is_string()
                 ? owner[name].get<std::string>()
                 : std::string();
    };
    if (owner.is_object() && owner.contains("gpus") && owner["gpus"].is_array()) {
      for (const auto& gpu : owner["gpus"]) {
        if (gpu.is_number_integer() && gpu.get<int>() >= 0 &&
            static_cast<std::size_t>(gpu.get<int>()) < inventory.gpus.size()) {
          group.gpus.push_back(gpu.get<int>());
        }
      }
    }
    group.labels = fmt::format("namespace=\"{}\",pod=\"{}\",container=\"{}\"",
                               metric_label(field("namespace")), metric_label(field("pod")),
                               metric_label(field("container")));
    ledger::Ledger ledger;
    ErrorText refused;
    const std::string path = (entry.path() / "group.ledger").string();
    if (!ledger.open(path.c_str(), refused)) {
      group.damage = refused.text;
    } else {
      group.members = ledger.live_members();
      group.priority = ledger.group_priority();
      for (std::size_t i = 0; i < group.gpus.size(); ++i) {
        group.usage.push_back(ledger.usage(static_cast<int>(i)));
      }
      if (const char* damage = ledger.damage(); damage != nullptr) group.damage = damage;
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace

std::string metric_label(const std::string& text) {
  std::string escaped;
  for (const char c : text.substr(0, 256)) {
    if (c == '\\' || c == '"') {
      escaped += '\\';
      escaped += c;
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string MetricsRenderer::render(const AgentStatus& status) {
  std::string out;
  const Inventory& inventory = *status.inventory;
  auto gpu_labels = [&](int gpu) {
    const GpuInfo& info = inventory.gpus[static_cast<std::size_t>(gpu)];
    return fmt::format("gpu=\"{}\",UUID=\"{}\",modelName=\"{}\",Hostname=\"{}\"", info.index,
                       metric_label(info.uuid), metric_label(info.name),
                       metric_label(status.hostname));
  };
  {
    Family health(out, "tessera_gpu_healthy", "gauge",
                  "1 while the GPU is healthy; 0 after a critical XID or ECC error, until the "
                  "recovery period passes without one");
    for (std::size_t gpu = 0; gpu < inventory.gpus.size(); ++gpu) {
      health.sample(gpu_labels(static_cast<int>(gpu)),
                    status.health->healthy(static_cast<int>(gpu)) ? 1 : 0);
    }
  }
  {
    Family errors(out, "tessera_gpu_health_errors_total", "counter",
                  "Critical errors seen on the GPU since the agent started");
    for (std::size_t gpu = 0; gpu < inventory.gpus.size(); ++gpu) {
      errors.sample(gpu_labels(static_cast<int>(gpu)),
                    static_cast<double>(status.health->errors(static_cast<int>(gpu))));
    }
  }
  {
    Family memory(out, "tessera_gpu_memory_total_bytes", "gauge", "The GPU's memory");
    for (std::size_t gpu = 0; gpu < inventory.gpus.size(); ++gpu) {
      memory.sample(gpu_labels(static_cast<int>(gpu)),
                    static_cast<double>(inventory.gpus[gpu].memory_bytes));
    }
  }
  {
    Family xids(out, "tessera_xid_events_total", "counter",
                "XID events seen by the health monitor (ignored ones included; 48 counts "
                "double-bit ECC errors)");
    for (const auto& [xid, count] : status.xids) {
      xids.sample(fmt::format("xid=\"{}\",Hostname=\"{}\"", xid, metric_label(status.hostname)),
                  static_cast<double>(count));
    }
  }
  {
    Family allocations(out, "tessera_allocations_total", "counter",
                       "Containers given devices by Allocate");
    for (const auto& [name, served] : status.resources) {
      allocations.sample(fmt::format("resource=\"{}\"", metric_label(name)),
                         static_cast<double>(served.allocations));
    }
  }
  {
    Family refusals(out, "tessera_allocation_refusals_total", "counter",
                    "Allocate requests refused (the pod sees UnexpectedAdmissionError)");
    for (const auto& [name, served] : status.resources) {
      refusals.sample(fmt::format("resource=\"{}\"", metric_label(name)),
                      static_cast<double>(served.refusals));
    }
  }
  {
    Family devices(out, "tessera_advertised_devices", "gauge",
                   "Devices advertised to the kubelet, by resource and health");
    for (const auto& [name, served] : status.resources) {
      devices.sample(fmt::format("resource=\"{}\",health=\"Healthy\"", metric_label(name)),
                     static_cast<double>(served.healthy));
      devices.sample(fmt::format("resource=\"{}\",health=\"Unhealthy\"", metric_label(name)),
                     static_cast<double>(served.devices - served.healthy));
    }
  }
  {
    Family generation(out, "tessera_config_generation", "gauge",
                      "How many configs the agent has applied since it started");
    generation.sample(static_cast<double>(status.config_generation));
    Family errors(out, "tessera_config_reload_errors_total", "counter",
                  "Configs refused (the last good one kept serving)");
    errors.sample(static_cast<double>(status.reload_errors));
    Family info(out, "tessera_config_info", "gauge",
                "The config being served; refused=1 while a newer one is refused");
    info.sample(fmt::format("config=\"{}\",refused=\"{}\"", metric_label(status.config_name),
                            status.config_refused ? 1 : 0),
                1);
  }

  const std::vector<Group> groups = read_groups(ledger_root_, inventory);
  const std::string host = fmt::format(",Hostname=\"{}\"", metric_label(status.hostname));
  const std::uint64_t now = monotonic_ns();
  std::lock_guard<std::mutex> locked(mutex_);
  std::map<std::string, Sample> current;
  Family limit(out, "tessera_container_memory_limit_bytes", "gauge",
               "Device memory the container's processes may hold on the GPU (absent: no limit)");
  std::string used_text, peak_text, refused_text, asked_text, achieved_text, throttled_text,
      priority_text, members_text, damaged_text;
  for (const Group& group : groups) {
    if (!group.damage.empty()) {
      damaged_text +=
          fmt::format("tessera_container_ledger_damaged{{{}{}}} 1\n", group.labels, host);
      continue;
    }
    members_text +=
        fmt::format("tessera_container_processes{{{}{}}} {}\n", group.labels, host, group.members);
    priority_text += fmt::format("tessera_container_priority{{{}{},priority=\"{}\"}} 1\n",
                                 group.labels, host, priority_name(group.priority));
    for (std::size_t i = 0; i < group.usage.size(); ++i) {
      const ledger::DeviceUsage& usage = group.usage[i];
      const std::string labels = group.labels + "," + gpu_labels(group.gpus[i]);
      if (usage.limit != kUnlimited) limit.sample(labels, static_cast<double>(usage.limit));
      used_text +=
          fmt::format("tessera_container_memory_used_bytes{{{}}} {}\n", labels, usage.used);
      peak_text +=
          fmt::format("tessera_container_memory_peak_bytes{{{}}} {}\n", labels, usage.peak);
      refused_text += fmt::format("tessera_container_memory_refusals_total{{{}}} {}\n", labels,
                                  usage.rejections);
      if (usage.cores != 0) {
        asked_text +=
            fmt::format("tessera_container_compute_share_percent{{{}}} {}\n", labels, usage.cores);
      }
      throttled_text += fmt::format("tessera_container_throttled_seconds_total{{{}}} {}\n", labels,
                                    static_cast<double>(usage.throttled_ns) / 1e9);
      const std::string key = group.directory + "#" + std::to_string(i);
      current[key] = Sample{usage.device_time_ns, now};
      if (const auto before = previous_.find(key);
          before != previous_.end() && now > before->second.at_ns &&
          usage.device_time_ns >= before->second.device_time_ns) {
        achieved_text += fmt::format(
            "tessera_container_compute_achieved_percent{{{}}} {:.2f}\n", labels,
            100.0 * static_cast<double>(usage.device_time_ns - before->second.device_time_ns) /
                static_cast<double>(now - before->second.at_ns));
      }
    }
  }
  previous_ = std::move(current);
  auto family = [&out](const char* name, const char* type, const char* help,
                       const std::string& samples) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name, help, name, type, samples);
  };
  family("tessera_container_memory_used_bytes", "gauge",
         "Device memory the container's live processes hold", used_text);
  family("tessera_container_memory_peak_bytes", "gauge", "The most the container has held",
         peak_text);
  family("tessera_container_memory_refusals_total", "counter", "Allocations refused for the limit",
         refused_text);
  family("tessera_container_compute_share_percent", "gauge",
         "The compute share the container was given", asked_text);
  family("tessera_container_compute_achieved_percent", "gauge",
         "Device time the container's launches were granted since the previous scrape, percent",
         achieved_text);
  family("tessera_container_throttled_seconds_total", "counter",
         "Time the container's launches waited for their share", throttled_text);
  family("tessera_container_priority", "gauge", "The container's priority (high, low or none)",
         priority_text);
  family("tessera_container_processes", "gauge", "Live processes in the container's group",
         members_text);
  family("tessera_container_ledger_damaged", "gauge",
         "1 for a container whose ledger cannot be trusted", damaged_text);
  return out;
}

}  // namespace tessera::node
