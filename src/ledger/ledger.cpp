#include "ledger/ledger.h"

#include <errno.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>

namespace tessera::ledger {
namespace {

constexpr char kMagic[8] = {'T', 'E', 'S', 'S', 'L', 'D', 'G', 'R'};

void initialize_file(void* base, const void* context) {
  const auto& spec = *static_cast<const GroupSpec*>(context);
  auto* file = static_cast<LedgerFile*>(base);
  std::memset(static_cast<void*>(file), 0, offsetof(LedgerFile, accounts));  // zeroes estimates too
  std::memcpy(file->magic, kMagic, sizeof kMagic);
  file->version = kFormatVersion;
  file->file_bytes = sizeof(LedgerFile);
  file->max_devices = kMostDevices;
  file->max_members = kMostMembers;
  std::strncpy(file->group_name, spec.name, sizeof file->group_name - 1);
  file->priority = static_cast<std::uint32_t>(spec.priority);
  file->burst = spec.burst ? 1 : 0;
  for (int device = 0; device < kMostDevices; ++device) {
    file->memory_limit[device] = spec.limits.memory_bytes[device];
    file->core_percent[device] = spec.limits.core_percent[device];
  }
  file->checksum = header_checksum(*file);
  initialize_accounts(file->accounts);
}

std::uint64_t min_limit(std::uint64_t a, std::uint64_t b) {
  if (a == kUnlimited) return b;
  if (b == kUnlimited) return a;
  return a < b ? a : b;
}

}  // namespace

std::uint64_t header_checksum(const LedgerFile& file) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&file);
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < offsetof(LedgerFile, checksum); ++i) {
    hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  }
  return hash;
}

bool Ledger::validate(const char* path, ErrorText& error) const {
  if (std::memcmp(file_->magic, kMagic, sizeof kMagic) != 0) {
    return error.set("%s: not a Tessera ledger (bad magic)", path);
  }
  if (file_->version != kFormatVersion) {
    return error.set("%s: ledger format version %u; this Tessera reads version %u", path,
                     file_->version, kFormatVersion);
  }
  if (file_->file_bytes != sizeof(LedgerFile) || file_->max_devices != kMostDevices ||
      file_->max_members != kMostMembers) {
    return error.set("%s: ledger geometry does not match this Tessera build", path);
  }
  if (file_->checksum != header_checksum(*file_)) {
    return error.set(
        "%s: ledger header checksum mismatch: the limits were modified or the file "
        "is corrupt; refusing to trust it",
        path);
  }
  if (std::memchr(file_->group_name, '\0', sizeof file_->group_name) == nullptr) {
    return error.set("%s: the group name is not terminated: corrupt ledger", path);
  }
  if (file_->priority > static_cast<std::uint32_t>(Priority::low)) {
    return error.set("%s: priority %u is not one Tessera knows: corrupt ledger", path,
                     file_->priority);
  }
  if (file_->burst > 1) {
    return error.set("%s: burst %u is neither 0 nor 1: corrupt ledger", path, file_->burst);
  }
  int bad_slot = 0;
  if (!accounts_look_valid(file_->accounts, bad_slot)) {
    return error.set("%s: member slot %d has an invalid state: corrupt ledger", path, bad_slot);
  }
  return true;
}

bool Ledger::attach(const char* path, ErrorText& error) {
  file_ = static_cast<LedgerFile*>(mapping_.base);
  if (!validate(path, error)) {
    close();
    return false;
  }
  for (int device = 0; device < kMostDevices; ++device) {
    file_limits_.memory_bytes[device] = file_->memory_limit[device];
    file_limits_.core_percent[device] = file_->core_percent[device];
  }
  file_priority_ = static_cast<Priority>(file_->priority);
  file_burst_ = file_->burst != 0;
  std::memcpy(verified_header_, file_, sizeof verified_header_);
  std::snprintf(path_, sizeof path_, "%s", path);
  damage_ = ErrorText{};
  accounts_.attach(&file_->accounts, mapping_.fd);
  guard_against_truncation(mapping_);
  return true;
}

bool Ledger::create_or_open(const char* path, const GroupSpec& spec, ErrorText& error) {
  close();
  if (!map_shared_file(path, sizeof(LedgerFile), initialize_file, &spec, mapping_, error) ||
      !attach(path, error)) {
    return false;
  }
  if (file_priority_ != spec.priority) {
    const Priority existing = file_priority_;
    close();
    return error.set("%s: group exists with priority %s; this run asks for %s", path,
                     priority_name(existing), priority_name(spec.priority));
  }
  if (file_burst_ != spec.burst) {
    const bool existing = file_burst_;
    close();
    return error.set("%s: group exists %s bursting; this run asks %s", path,
                     existing ? "with" : "without", spec.burst ? "for it" : "for none");
  }
  for (int device = 0; device < kMostDevices; ++device) {
    if (file_->core_percent[device] != spec.limits.core_percent[device]) {
      const unsigned existing = file_->core_percent[device];
      close();
      return error.set(
          "%s: group exists with a compute share of %u%% on device %d; this run asks for %u%%",
          path, existing, device, spec.limits.core_percent[device]);
    }
    if (file_->memory_limit[device] != spec.limits.memory_bytes[device]) {
      const unsigned long long existing = file_->memory_limit[device];
      close();
      return error.set(
          "%s: group exists with a memory limit of %llu bytes on device %d; this "
          "run asks for %llu",
          path, existing, device,
          static_cast<unsigned long long>(spec.limits.memory_bytes[device]));
    }
  }
  return true;
}

bool Ledger::open(const char* path, ErrorText& error) {
  close();
  return map_shared_file(path, sizeof(LedgerFile), nullptr, nullptr, mapping_, error) &&
         attach(path, error);
}

bool Ledger::create_or_open_kept(const char* path, const GroupSpec& spec, ErrorText& error) {
  // A run that removes the file holds its exclusive use from the check to the unlink; a file
  // opened meanwhile is unlinked by then, and another try makes or opens the one in place.
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (!create_or_open(path, spec, error)) return false;
    if (!hold_shared_use(mapping_.fd)) {
      const int failure = errno;
      close();
      return error.set("%s: cannot hold the ledger in use: %s", path, std::strerror(failure));
    }
    if (names_open_file(path, mapping_.fd)) return true;
    close();
  }
  return error.set("%s: removed each time it was opened; giving up", path);
}

bool Ledger::remove_if_unused(const char* path) {
  bool removed = false;
  if (file_ != nullptr && try_exclusive_use(mapping_.fd) && live_members() == 0 &&
      names_open_file(path, mapping_.fd)) {
    removed = unlink(path) == 0;
  }
  close();  // drops the exclusive use with the descriptor
  return removed;
}

const char* Ledger::damage() {
  if (file_ == nullptr) return nullptr;
  if (damage_.empty()) {
    if (!intact()) {
      damage_.set("ledger %s is damaged: its header was written over or truncated", path_);
    } else if (accounts_.damage() != nullptr) {
      damage_.set("ledger %s is damaged: %s", path_, accounts_.damage());
    }
  }
  return damage_.empty() ? nullptr : damage_.text;
}

bool Ledger::create_private(const GroupSpec& spec, ErrorText& error) {
  close();
  return map_private_shared("tessera-ledger", sizeof(LedgerFile), initialize_file, &spec, mapping_,
                            error) &&
         attach("private ledger", error);
}

void Ledger::close() {
  mapping_.close();  // the kernel drops our liveness lock with the descriptor
  file_ = nullptr;
  accounts_.detach();
}

std::uint64_t Ledger::effective_limit(int device) const {
  return min_limit(file_limits_.memory_bytes[device], process_limits_.memory_bytes[device]);
}

std::uint32_t Ledger::effective_cores(int device) const {
  const std::uint32_t file = file_limits_.core_percent[device];
  const std::uint32_t process = process_limits_.core_percent[device];
  if (file == 0) return process;
  if (process == 0) return file;
  return file < process ? file : process;
}

std::uint64_t Ledger::pace(int device, std::uint64_t cost_ns, std::uint64_t now_ns,
                           std::uint64_t lead_ns, std::uint32_t percent) {
  const std::uint64_t earn_ns = cost_ns * 100 / (percent == 0 ? 100 : percent);
  std::atomic<std::uint64_t>& clock = file_->compute_clock_ns[device];
  std::uint64_t granted = clock.load(std::memory_order_relaxed);
  std::uint64_t start = 0;
  do {
    // Idle time is not saved up: a hard cap never lends more than `lead_ns`.
    start = granted > now_ns ? granted : now_ns;
  } while (!clock.compare_exchange_weak(granted, start + earn_ns, std::memory_order_relaxed));
  file_->device_time_ns[device].fetch_add(cost_ns, std::memory_order_relaxed);
  return start > now_ns + lead_ns ? start - lead_ns : now_ns;
}

bool Ledger::join(ErrorText& error) {
  if (!intact()) return error.set("%s", damage());
  if (accounts_.join(error)) return true;
  ErrorText reason = error;
  return error.set("ledger of group '%s': %s", file_->group_name, reason.text);
}

DeviceUsage Ledger::usage(int device) {
  AccountsUsage accounts;
  if (intact()) accounts = accounts_.usage(device);
  if (!intact()) accounts = AccountsUsage{};  // truncated meanwhile: what was read is zeroes
  return {effective_limit(device),
          effective_cores(device),
          file_->throttled_ns[device].load(std::memory_order_relaxed),
          file_->held_ns[device].load(std::memory_order_relaxed),
          file_->device_time_ns[device].load(std::memory_order_relaxed),
          accounts.used,
          accounts.peak,
          accounts.rejections};
}

void Ledger::after_fork_in_child() {
  if (file_ == nullptr) return;
  mapping_.reopen_in_child();
  accounts_.forget_slot();
}

}  // namespace tessera::ledger
