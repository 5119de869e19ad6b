// Where things are, as the node agent lays them out on the host and a container sees them,
// and the one rule every process uses to find a device's coordination file. Guest-safe: the
// hook includes it. Host-side paths under the node agent's state directory are in
// contract/host_layout.h.
//
// Inside a container given a slice:
//   /etc/ld.so.preload                          names the hook (read-only)
//   /usr/local/lib/tessera/libtessera-cuda.so   the hook (read-only)
//   /var/run/tessera/group.ledger               its own ledger: its limits and accounts
//   /var/run/tessera/devices/<key>.demand       each of its devices' coordination file
// A `tessera run` group's ledger is <runtime>/<group>.ledger, its devices' coordination files
// <runtime>/devices/<key>.demand: the same rule, beside the ledger.
#pragma once

#include <cstddef>
#include <cstring>
#include <string_view>

#include "common/bounded_format.h"
#include "common/error_text.h"

namespace tessera::contract {

inline constexpr const char* kContainerPreloadPath = "/etc/ld.so.preload";
inline constexpr const char* kContainerHookPath = "/usr/local/lib/tessera/libtessera-cuda.so";
inline constexpr const char* kContainerGroupDirectory = "/var/run/tessera";
inline constexpr const char* kLedgerFileName = "group.ledger";
inline constexpr const char* kContainerLedgerPath = "/var/run/tessera/group.ledger";
static_assert(std::string_view(kContainerLedgerPath).starts_with(kContainerGroupDirectory) &&
                  std::string_view(kContainerLedgerPath).ends_with(kLedgerFileName),
              "the container's ledger is its group directory's ledger file");
inline constexpr const char* kCoordinationDirectoryName = "devices";
inline constexpr const char* kCoordinationSuffix = ".demand";

// A device's key: the 32 lowercase hex digits of its 16-byte UUID, as CUDA (cuDeviceGetUuid)
// and NVML ("GPU-..." for a GPU, "MIG-..." for a MIG device) both give it. It names the
// device's coordination file whatever ordinal a process sees the device as.
inline constexpr std::size_t kDeviceKeyLength = 32;
struct DeviceKey {
  char text[kDeviceKeyLength + 1] = {};
};

inline DeviceKey device_key(const unsigned char (&bytes)[16]) {
  constexpr char kHex[] = "0123456789abcdef";
  DeviceKey key;
  for (int i = 0; i < 16; ++i) {
    key.text[2 * i] = kHex[bytes[i] >> 4];
    key.text[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return key;
}

// From NVML's text ("GPU-" or "MIG-" and 32 hex digits among dashes); false for anything else
// (the old "MIG-GPU-<uuid>/<gi>/<ci>" form among them).
inline bool device_key_from_uuid(const char* uuid, DeviceKey& key) {
  if (uuid == nullptr || (std::strncmp(uuid, "GPU-", 4) != 0 && std::strncmp(uuid, "MIG-", 4) != 0))
    return false;
  std::size_t digits = 0;
  for (const char* c = uuid + 4; *c != '\0'; ++c) {
    if (*c == '-') continue;
    const bool hex =
        (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || (*c >= 'A' && *c <= 'F');
    if (!hex || digits == kDeviceKeyLength) return false;
    key.text[digits++] = (*c >= 'A' && *c <= 'F') ? static_cast<char>(*c - 'A' + 'a') : *c;
  }
  key.text[digits] = '\0';
  return digits == kDeviceKeyLength;
}

// The coordination file of the device `key` for the group whose ledger is `ledger_path`:
// <the ledger's directory>/devices/<key>.demand. False, with `error`, if it does not fit.
inline bool coordination_path(const char* ledger_path, const DeviceKey& key, char* out,
                              std::size_t size, ErrorText& error) {
  const char* slash = std::strrchr(ledger_path, '/');
  const int directory = slash == nullptr ? 1 : static_cast<int>(slash - ledger_path);
  return format_bounded(out, size, error, "%.*s/%s/%s%s", directory,
                        slash == nullptr ? "." : ledger_path, kCoordinationDirectoryName, key.text,
                        kCoordinationSuffix);
}

}  // namespace tessera::contract
