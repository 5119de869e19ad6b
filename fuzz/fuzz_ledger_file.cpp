// A group's ledger as other members may have written it: a valid ledger (100 MiB on device 0),
// patched anywhere at the fuzzer's choice, its checksum then recomputed or not (a writer who
// knows the format, or random damage). Opening it must refuse it with a message or give a
// ledger that never lets this process hold more than its own limit.
//
// Not patched: the robust mutex. Its word is shared by design; a member that writes an
// owner into it can make the others wait, which no reading of the file can prevent.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "ledger/ledger.h"

using namespace tessera;
using namespace tessera::ledger;
using tessera::fuzz::broken;

namespace {

constexpr std::uint64_t kLimit = std::uint64_t{100} << 20;

struct Fixture {
  std::string path;
  std::vector<std::uint8_t> valid;  // the file as its creator left it
  DeviceLimits limits;

  Fixture() {
    char directory[] = "/tmp/tessera-fuzz-ledger-XXXXXX";
    if (mkdtemp(directory) == nullptr) broken("no temporary directory");
    path = std::string(directory) + "/group.ledger";
    limits.memory_bytes[0] = kLimit;
    Ledger ledger;
    ErrorText error;
    if (!ledger.create_or_open(path.c_str(), GroupSpec{.name = "fuzz", .limits = limits}, error)) {
      broken(error.text);
    }
    valid.assign(reinterpret_cast<const std::uint8_t*>(ledger.file()),
                 reinterpret_cast<const std::uint8_t*>(ledger.file()) + sizeof(LedgerFile));
  }
};

bool in_lock(std::size_t offset) {
  const std::size_t lock = offsetof(LedgerFile, accounts) + offsetof(SharedAccounts, lock);
  return offset >= lock && offset < lock + sizeof(pthread_mutex_t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Fixture fixture;
  if (size == 0) return 0;
  std::vector<std::uint8_t> image = fixture.valid;
  // Patches of three bytes: a little-endian offset into the file, and the byte to put there.
  for (std::size_t i = 1; i + 3 <= size; i += 3) {
    const std::size_t offset = (data[i] | (data[i + 1] << 8)) % image.size();
    if (!in_lock(offset)) image[offset] = data[i + 2];
  }
  if (data[0] & 1) {
    auto* file = reinterpret_cast<LedgerFile*>(image.data());
    file->checksum = header_checksum(*file);
  }
  {
    const int fd = ::open(fixture.path.c_str(), O_WRONLY | O_TRUNC);
    if (fd < 0 || write(fd, image.data(), image.size()) != static_cast<ssize_t>(image.size())) {
      broken("cannot write the ledger");
    }
    ::close(fd);
  }
  Ledger ledger;
  ErrorText error;
  if (!ledger.open(fixture.path.c_str(), error)) {
    if (error.empty()) broken("a ledger refused without a message");
    return 0;
  }
  ledger.set_process_limits(fixture.limits);
  const std::uint64_t limit = ledger.effective_limit(0);
  if (limit == kUnlimited || limit > kLimit) broken("the file raised this process's limit");
  if (!ledger.join(error)) return 0;
  if (ledger.reserve(0, kLimit + 1)) broken("more than the limit was reserved");
  for (int device = 0; device < kMaxDevices; ++device) {
    const DeviceUsage usage = ledger.usage(device);
    (void)usage;
  }
  if (ledger.reserve(0, kLimit / 2)) {
    if (ledger.member_used(0) != kLimit / 2) broken("a reservation was not charged");
    ledger.release(0, kLimit / 2);
  }
  return 0;
}
