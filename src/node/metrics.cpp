#include "node/metrics.h"

#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "base/prometheus.h"
#include "common/clock.h"
#include "common/limits.h"
#include "common/priority.h"
#include "contract/owner_record.h"
#include "ledger/ledger.h"

namespace tessera::node {
namespace {

namespace fs = std::filesystem;

using base::Exposition;
using base::metric_label;

struct Group {
  std::string directory, labels;
  std::vector<int> gpus;  // the inventory's indices, by the container's ordinal
  std::vector<ledger::DeviceUsage> usage;
  Priority priority = Priority::none;
  int members = 0;
  std::string damage;
};

std::vector<Group> read_groups(const contract::StateLayout& layout, const Inventory& inventory) {
  std::vector<Group> groups;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(layout.containers(), error)) {
    Group group;
    group.directory = entry.path().filename().string();
    contract::OwnerRecord owner;
    if (!contract::read_owner_record(layout.owner_record(group.directory), owner).ok()) continue;
    if (!owner.limits_written) continue;  // not started yet: no limits to show
    for (const int gpu : owner.gpus) {
      if (gpu >= 0 && static_cast<std::size_t>(gpu) < inventory.gpus.size()) {
        group.gpus.push_back(gpu);
      }
    }
    group.labels = fmt::format("namespace=\"{}\",pod=\"{}\",container=\"{}\"",
                               metric_label(owner.pod_namespace), metric_label(owner.pod_name),
                               metric_label(owner.container));
    ledger::Ledger ledger;
    ErrorText refused;
    const std::string path = layout.ledger(group.directory);
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

std::string MetricsRenderer::render(const AgentStatus& status) {
  Exposition out;
  out.family("tessera_gpu_healthy", "gauge",
             "1 while the GPU is healthy; 0 after a critical XID or ECC error, until the recovery "
             "period passes without one");
  out.family("tessera_gpu_health_errors_total", "counter",
             "Critical errors seen on the GPU since the agent started");
  out.family("tessera_gpu_memory_total_bytes", "gauge", "The GPU's memory");
  out.family("tessera_xid_events_total", "counter",
             "XID events seen by the health monitor (ignored ones included; 48 counts double-bit "
             "ECC errors)");
  out.family("tessera_allocations_total", "counter", "Containers given devices by Allocate");
  out.family("tessera_allocation_refusals_total", "counter",
             "Allocate requests refused (the pod sees UnexpectedAdmissionError)");
  out.family("tessera_advertised_devices", "gauge",
             "Devices advertised to the kubelet, by resource and health");
  out.family("tessera_config_generation", "gauge",
             "How many configs the agent has applied since it started");
  out.family("tessera_assignments_rewritten_total", "counter",
             "Containers the kubelet gave another GPU than the scheduler assigned; their pods' "
             "assignments were rewritten to the GPU they got");
  out.family("tessera_config_reload_errors_total", "counter",
             "Configs refused (the last good one kept serving)");
  out.family("tessera_config_info", "gauge",
             "The config being served; refused=1 while a newer one is refused");
  out.family("tessera_container_memory_limit_bytes", "gauge",
             "Device memory the container's processes may hold on the GPU (absent: no limit)");
  out.family("tessera_container_memory_used_bytes", "gauge",
             "Device memory the container's live processes hold");
  out.family("tessera_container_memory_peak_bytes", "gauge", "The most the container has held");
  out.family("tessera_container_memory_refusals_total", "counter",
             "Allocations refused for the limit");
  out.family("tessera_container_compute_share_percent", "gauge",
             "The compute share the container was given");
  out.family("tessera_container_compute_achieved_percent", "gauge",
             "Device time the container's launches were granted since the previous scrape, "
             "percent");
  out.family("tessera_container_throttled_seconds_total", "counter",
             "Time the container's launches waited for their share");
  out.family("tessera_container_held_for_priority_seconds_total", "counter",
             "Time the container's low-priority launches gave way to high-priority work");
  out.family("tessera_container_priority", "gauge", "The container's priority (high, low or none)");
  out.family("tessera_container_processes", "gauge", "Live processes in the container's group");
  out.family("tessera_container_ledger_damaged", "gauge",
             "1 for a container whose ledger cannot be trusted");

  const Inventory& inventory = *status.inventory;
  const std::string host = fmt::format("Hostname=\"{}\"", metric_label(status.hostname));
  auto gpu_labels = [&](int gpu) {
    const GpuInfo& info = inventory.gpus[static_cast<std::size_t>(gpu)];
    return fmt::format("gpu=\"{}\",UUID=\"{}\",modelName=\"{}\",{}", info.index,
                       metric_label(info.uuid), metric_label(info.name), host);
  };
  for (std::size_t index = 0; index < inventory.gpus.size(); ++index) {
    const int gpu = static_cast<int>(index);
    out.add("tessera_gpu_healthy", gpu_labels(gpu), status.health->healthy(gpu) ? 1 : 0);
    out.add("tessera_gpu_health_errors_total", gpu_labels(gpu),
            static_cast<double>(status.health->errors(gpu)));
    out.add("tessera_gpu_memory_total_bytes", gpu_labels(gpu),
            static_cast<double>(inventory.gpus[index].memory_bytes));
  }
  for (const auto& [xid, count] : status.xids) {
    out.add("tessera_xid_events_total", fmt::format("xid=\"{}\",{}", xid, host),
            static_cast<double>(count));
  }
  for (const auto& [name, served] : status.resources) {
    const std::string resource = fmt::format("resource=\"{}\"", metric_label(name));
    out.add("tessera_allocations_total", resource, static_cast<double>(served.allocations));
    out.add("tessera_allocation_refusals_total", resource, static_cast<double>(served.refusals));
    out.add("tessera_advertised_devices", resource + ",health=\"Healthy\"",
            static_cast<double>(served.healthy));
    out.add("tessera_advertised_devices", resource + ",health=\"Unhealthy\"",
            static_cast<double>(served.devices - served.healthy));
  }
  out.add("tessera_config_generation", "", static_cast<double>(status.config_generation));
  out.add("tessera_config_reload_errors_total", "", static_cast<double>(status.reload_errors));
  out.add("tessera_assignments_rewritten_total", "",
          static_cast<double>(status.assignments_rewritten));
  out.add("tessera_config_info",
          fmt::format("config=\"{}\",refused=\"{}\"", metric_label(status.config_name),
                      status.config_refused ? 1 : 0),
          1);

  const std::vector<Group> groups = read_groups(layout_, inventory);
  const std::uint64_t now = monotonic_ns();
  base::MutexLock locked(mutex_);
  std::map<std::string, Sample> current;
  for (const Group& group : groups) {
    const std::string labels = group.labels + "," + host;
    if (!group.damage.empty()) {
      out.add("tessera_container_ledger_damaged", labels, 1);
      continue;
    }
    out.add("tessera_container_processes", labels, group.members);
    out.add("tessera_container_priority",
            fmt::format("{},priority=\"{}\"", labels, priority_name(group.priority)), 1);
    for (std::size_t i = 0; i < group.usage.size(); ++i) {
      const ledger::DeviceUsage& usage = group.usage[i];
      const std::string on_gpu = group.labels + "," + gpu_labels(group.gpus[i]);
      if (usage.limit != kUnlimited) {
        out.add("tessera_container_memory_limit_bytes", on_gpu, static_cast<double>(usage.limit));
      }
      out.add("tessera_container_memory_used_bytes", on_gpu, static_cast<double>(usage.used));
      out.add("tessera_container_memory_peak_bytes", on_gpu, static_cast<double>(usage.peak));
      out.add("tessera_container_memory_refusals_total", on_gpu,
              static_cast<double>(usage.rejections));
      if (usage.cores != 0) {
        out.add("tessera_container_compute_share_percent", on_gpu, usage.cores);
      }
      out.add("tessera_container_throttled_seconds_total", on_gpu,
              static_cast<double>(usage.throttled_ns) / 1e9);
      out.add("tessera_container_held_for_priority_seconds_total", on_gpu,
              static_cast<double>(usage.held_ns) / 1e9);
      const std::string key = group.directory + "#" + std::to_string(i);
      current[key] = Sample{usage.device_time_ns, now};
      const auto before = previous_.find(key);
      if (before != previous_.end() && now > before->second.at_ns &&
          usage.device_time_ns >= before->second.device_time_ns) {
        out.add("tessera_container_compute_achieved_percent", on_gpu,
                100.0 * static_cast<double>(usage.device_time_ns - before->second.device_time_ns) /
                    static_cast<double>(now - before->second.at_ns));
      }
    }
  }
  previous_ = std::move(current);
  return out.text();
}

}  // namespace tessera::node
