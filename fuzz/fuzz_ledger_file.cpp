// A group's ledger as other members may have written it: a valid ledger (100 MiB on device 0),
// patched anywhere at the fuzzer's choice, its checksum then recomputed or not (a writer who
// knows the format, or random damage), either before this process opens it or while it is a
// member holding 60 MiB. Opening it must refuse it with a message, or give a ledger that
// never lets the group hold more than its limit: a damaged one refuses, and says why.
//
// Not patched: the lock word of the robust mutex (the rest of the mutex is). An owner
// written into it makes each request wait out the lock's timeout and be refused, which
// Ledger.ALockThatIsNeverReleasedRefusesWithinItsTimeout tests; here it would only be slow.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "contract/layout.h"
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
    path = std::string(directory) + "/" + contract::kLedgerFileName;
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

bool in_lock_word(std::size_t offset) {
  const std::size_t lock = offsetof(LedgerFile, accounts) + offsetof(SharedAccounts, lock);
  return offset >= lock && offset < lock + sizeof(int);
}

void write_file(const std::string& path, const std::vector<std::uint8_t>& image, int flags) {
  const int fd = ::open(path.c_str(), O_WRONLY | flags);
  if (fd < 0 || pwrite(fd, image.data(), image.size(), 0) != static_cast<ssize_t>(image.size())) {
    broken("cannot write the ledger");
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Fixture fixture;
  if (size == 0) return 0;
  const bool while_in_use = (data[0] & 2) != 0;
  write_file(fixture.path, fixture.valid, O_TRUNC);
  Ledger member;  // joined before the damage, when there is a member
  ErrorText error;
  std::uint64_t held = 0;
  if (while_in_use) {
    if (!member.open(fixture.path.c_str(), error) || !member.join(error)) broken(error.text);
    member.set_process_limits(fixture.limits);
    if (!member.reserve(0, kLimit / 10 * 6)) broken("a valid ledger refused 60 MiB of 100");
    held = kLimit / 10 * 6;
  }
  std::vector<std::uint8_t> image = fixture.valid;
  if (while_in_use) {  // as it is now, the member's charge in it
    const int fd = ::open(fixture.path.c_str(), O_RDONLY);
    if (fd < 0 || pread(fd, image.data(), image.size(), 0) != static_cast<ssize_t>(image.size())) {
      broken("cannot read the ledger");
    }
    ::close(fd);
  }
  // Patches of three bytes: a little-endian offset into the file, and the byte to put there.
  for (std::size_t i = 1; i + 3 <= size; i += 3) {
    const std::size_t offset = (data[i] | (data[i + 1] << 8)) % image.size();
    if (!in_lock_word(offset)) image[offset] = data[i + 2];
  }
  if (data[0] & 1) {
    auto* file = reinterpret_cast<LedgerFile*>(image.data());
    file->checksum = header_checksum(*file);
  }
  write_file(fixture.path, image, 0);  // in place: a member's mapping sees it

  if (while_in_use && member.reserve(0, kLimit - held + 1)) {
    broken("a member was granted more than the limit after the file was written");
  }
  Ledger ledger;
  if (!ledger.open(fixture.path.c_str(), error)) {
    if (error.empty()) broken("a ledger refused without a message");
    return 0;
  }
  ledger.set_process_limits(fixture.limits);
  const std::uint64_t limit = ledger.effective_limit(0);
  if (limit == kUnlimited || limit > kLimit) broken("the file raised this process's limit");
  if (!ledger.join(error)) return 0;
  if (ledger.reserve(0, kLimit + 1)) broken("more than the limit was reserved");
  for (int device = 0; device < kMostDevices; ++device) {
    const DeviceUsage usage = ledger.usage(device);
    (void)usage;
  }
  // With the member's 60 MiB still held, 50 more would be over the limit.
  const std::uint64_t half = kLimit / 2;
  if (ledger.reserve(0, half)) {
    if (while_in_use && member.damage() == nullptr && ledger.damage() == nullptr) {
      broken("50 MiB granted beside a member's 60 under a limit of 100");
    }
    if (ledger.member_used(0) != half) broken("a reservation was not charged");
    ledger.release(0, half);
  }
  if (ledger.reserve(0, 1) && ledger.damage() != nullptr) broken("a damaged ledger granted");
  return 0;
}
