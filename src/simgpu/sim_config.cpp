#include "simgpu/sim_config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/mutex.h"
#include "common/text.h"
#include "common/units.h"

namespace tessera::sim {
namespace {

constexpr std::uint64_t kGiB = 1024ull * 1024 * 1024;
constexpr std::uint64_t kMiB = 1024ull * 1024;

struct Preset {
  const char* model;
  const char* name;
  std::uint64_t memory_bytes;
  int sm_count, cc_major, cc_minor;
  std::uint64_t context_bytes;
  int mig_family;               // sim_nvml_mig.cpp's MIG profile tables: -1 none
  std::uint32_t pci_device_id;  // device << 16 | NVIDIA's vendor ID, as mig-parted filters
};

// Memory as the driver reports it (a little under the marketing figure). A context's cost is
// of the order nvidia-smi shows for a process that has only created one under CUDA 12 with
// lazy loading: a few hundred MiB, more on larger parts (it is mostly per-SM local memory
// and the driver's own reservations). Not exact figures: `context=` sets a measured one.
constexpr Preset kPresets[] = {
    {"H100", "NVIDIA H100 80GB HBM3", 81559 * kMiB, 132, 9, 0, 512 * kMiB, kMigH100, 0x233010DE},
    {"H200", "NVIDIA H200", 143771 * kMiB, 132, 9, 0, 512 * kMiB, kMigH200, 0x233510DE},
    {"A100", "NVIDIA A100-SXM4-40GB", 40536 * kMiB, 108, 8, 0, 416 * kMiB, kMigA100_40, 0x20B010DE},
    {"A100-80GB", "NVIDIA A100-SXM4-80GB", 81920 * kMiB, 108, 8, 0, 416 * kMiB, kMigA100_80,
     0x20B210DE},
    {"A30", "NVIDIA A30", 24576 * kMiB, 56, 8, 0, 320 * kMiB, kMigA30, 0x20B710DE},
    {"T4", "Tesla T4", 15360 * kMiB, 40, 7, 5, 256 * kMiB, -1, 0x1EB810DE},
    {"V100", "Tesla V100-SXM2-32GB", 32 * kGiB, 80, 7, 0, 304 * kMiB, -1, 0x1DB510DE},
};

void trim(std::string_view& text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
}

void copy_text(char* destination, std::size_t size, std::string_view text) {
  const std::size_t length = text.size() < size - 1 ? text.size() : size - 1;
  std::memcpy(destination, text.data(), length);
  destination[length] = '\0';
}

bool parse_device(std::string_view entry, const char* origin, int index, DeviceSpec& device,
                  ErrorText& error) {
  std::size_t comma = entry.find(',');
  std::string_view model = slice(entry, 0, comma);
  trim(model);
  const Preset* preset = nullptr;
  for (const Preset& candidate : kPresets) {
    if (model == candidate.model) preset = &candidate;
  }
  if (preset == nullptr) {
    return error.set(
        "%s: device %d: unknown model '%.*s' (known: H100, H200, A100, A100-80GB, "
        "A30, T4, V100)",
        origin, index, static_cast<int>(model.size()), model.data());
  }
  std::memset(&device, 0, sizeof device);
  copy_text(device.name, sizeof device.name, preset->name);
  device.memory_bytes = preset->memory_bytes;
  device.sm_count = preset->sm_count;
  device.cc_major = preset->cc_major;
  device.cc_minor = preset->cc_minor;
  device.context_bytes = preset->context_bytes;
  device.numa_node = -1;
  device.mig_family = preset->mig_family;
  device.pci_device_id = preset->pci_device_id;
  std::snprintf(device.uuid, sizeof device.uuid, "GPU-7e55e7a0-0000-4000-8000-%012x", index);
  std::snprintf(device.pci_bus_id, sizeof device.pci_bus_id, "00000000:%02X:00.0", 0x10 + index);
  while (comma != std::string_view::npos) {
    entry = slice(entry, comma + 1);
    comma = entry.find(',');
    std::string_view pair = slice(entry, 0, comma);
    trim(pair);
    const std::size_t equals = pair.find('=');
    std::string_view key = slice(pair, 0, equals);
    std::string_view value = equals == std::string_view::npos ? "" : slice(pair, equals + 1);
    trim(key);
    trim(value);
    std::uint64_t number = 0;
    if (key == "memory" || key == "context") {
      if (!parse_size(value, number) || (key == "memory" && number == 0)) {
        return error.set("%s: device %d: %.*s='%.*s' is not a size", origin, index,
                         static_cast<int>(key.size()), key.data(), static_cast<int>(value.size()),
                         value.data());
      }
      (key == "memory" ? device.memory_bytes : device.context_bytes) = number;
    } else if (key == "sms") {
      if (!parse_size(value, number) || number == 0 || number > 100000) {
        return error.set("%s: device %d: sms='%.*s' is not a count of SMs", origin, index,
                         static_cast<int>(value.size()), value.data());
      }
      device.sm_count = static_cast<int>(number);
    } else if (key == "numa") {
      if (!parse_size(value, number) || number > 1023) {
        return error.set("%s: device %d: numa='%.*s' is not a NUMA node number (0 to 1023)", origin,
                         index, static_cast<int>(value.size()), value.data());
      }
      device.numa_node = static_cast<int>(number);
    } else if (key == "name") {
      copy_text(device.name, sizeof device.name, value);
    } else if (key == "uuid") {
      if (slice(value, 0, 4) != "GPU-" || value.size() >= sizeof device.uuid) {
        return error.set("%s: device %d: uuid='%.*s' must look like GPU-xxxxxxxx-...", origin,
                         index, static_cast<int>(value.size()), value.data());
      }
      copy_text(device.uuid, sizeof device.uuid, value);
    } else {
      return error.set(
          "%s: device %d: unknown field '%.*s' (known: memory, sms, context, numa, "
          "name, uuid)",
          origin, index, static_cast<int>(key.size()), key.data());
    }
  }
  return true;
}

}  // namespace

bool parse_machine_spec(const char* text, const char* origin, MachineSpec& spec, ErrorText& error) {
  spec.device_count = 0;
  std::string_view rest(text);
  while (!rest.empty()) {
    const std::size_t end = rest.find_first_of(";\n");
    std::string_view entry = slice(rest, 0, end);
    rest = end == std::string_view::npos ? std::string_view() : slice(rest, end + 1);
    const std::size_t hash = entry.find('#');
    if (hash != std::string_view::npos) entry = slice(entry, 0, hash);
    trim(entry);
    if (entry.empty()) continue;
    if (spec.device_count == kMostDevices) {
      return error.set("%s: more than %d devices", origin, kMostDevices);
    }
    if (!parse_device(entry, origin, spec.device_count, spec.devices[spec.device_count], error)) {
      return false;
    }
    ++spec.device_count;
  }
  if (spec.device_count == 0) return error.set("%s: no devices listed", origin);
  return true;
}

bool machine_spec_from_environment(MachineSpec& spec, ErrorText& error) {
  if (const char* path = std::getenv("TESSERA_SIM_CONFIG"); path != nullptr && path[0] != '\0') {
    char text[8192];
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return error.set("TESSERA_SIM_CONFIG=%s: cannot open: %s", path, std::strerror(errno));
    }
    const ssize_t length = read(fd, text, sizeof text - 1);
    close(fd);
    if (length < 0) return error.set("TESSERA_SIM_CONFIG=%s: cannot read", path);
    text[length] = '\0';
    return parse_machine_spec(text, path, spec, error);
  }
  if (const char* devices = std::getenv("TESSERA_SIM_DEVICES"); devices != nullptr) {
    return parse_machine_spec(devices, "TESSERA_SIM_DEVICES", spec, error);
  }
  return parse_machine_spec("H100", "default", spec, error);
}

namespace {

// Calls so far of each entry point named with a call number ("name#3"), this process.
struct CallCount {
  const char* entry_point;
  unsigned calls;
};
constinit Mutex call_counts_lock;
CallCount call_counts[16] GUARDED_BY(call_counts_lock);

unsigned count_call(const char* entry_point) {
  MutexLock locked(call_counts_lock);
  unsigned calls = 0;
  for (CallCount& count : call_counts) {
    if (count.entry_point == nullptr) count.entry_point = entry_point;
    if (std::strcmp(count.entry_point, entry_point) == 0) {
      calls = ++count.calls;
      break;
    }
  }
  return calls;
}

}  // namespace

bool injected_failure(const char* entry_point) {
  const char* names = std::getenv("TESSERA_SIM_FAIL");
  if (names == nullptr) return false;
  const std::size_t length = std::strlen(entry_point);
  bool counted = false;
  unsigned calls = 0;
  for (const char* at = names; *at != '\0';) {
    const char* end = std::strchr(at, ',');
    const std::size_t size = end == nullptr ? std::strlen(at) : static_cast<std::size_t>(end - at);
    if (size == length && std::strncmp(at, entry_point, length) == 0) return true;
    // "name#N": only the N-th call fails.
    if (size > length + 1 && std::strncmp(at, entry_point, length) == 0 && at[length] == '#') {
      if (!counted) {
        calls = count_call(entry_point);
        counted = true;
      }
      if (std::strtoul(at + length + 1, nullptr, 10) == calls) return true;
    }
    if (end == nullptr) break;
    at = end + 1;
  }
  return false;
}

}  // namespace tessera::sim
