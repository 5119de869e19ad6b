// The demand file beside the ledgers (tessera.demand) as other groups may have written it: a
// valid file patched anywhere at the fuzzer's choice. Opening it refuses it with a message or
// gives a file whose stamps, claims and high-priority times are read without fault.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "ledger/demand.h"

using namespace tessera;
using namespace tessera::ledger;
using tessera::fuzz::broken;

namespace {

struct Fixture {
  std::string directory, path;
  std::vector<std::uint8_t> valid;

  Fixture() {
    char made[] = "/tmp/tessera-fuzz-demand-XXXXXX";
    if (mkdtemp(made) == nullptr) broken("no temporary directory");
    directory = made;
    path = directory + "/tessera.demand";
    Demand demand;
    ErrorText error;
    if (!demand.open(directory.c_str(), 1, error)) broken(error.text);
    valid.resize(sizeof(DemandFile));
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0 || read(fd, valid.data(), valid.size()) != static_cast<ssize_t>(valid.size())) {
      broken("cannot read the demand file");
    }
    ::close(fd);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Fixture fixture;
  if (size < 9) return 0;
  std::vector<std::uint8_t> image = fixture.valid;
  // The first 8 bytes: "now" for the calls below; then patches of four bytes, a
  // little-endian offset into the file and the byte to put there.
  std::uint64_t now_ns = 0;
  for (int i = 0; i < 8; ++i) now_ns |= std::uint64_t{data[i]} << (8 * i);
  for (std::size_t i = 8; i + 4 <= size; i += 4) {
    const std::size_t offset = (data[i] | (data[i + 1] << 8) | (data[i + 2] << 16)) % image.size();
    image[offset] = data[i + 3];
  }
  {
    const int fd = ::open(fixture.path.c_str(), O_WRONLY | O_TRUNC);
    if (fd < 0 || write(fd, image.data(), image.size()) != static_cast<ssize_t>(image.size())) {
      broken("cannot write the demand file");
    }
    ::close(fd);
  }
  Demand demand;
  ErrorText error;
  const std::uint64_t group = 1 + (now_ns % 7);
  if (!demand.open(fixture.directory.c_str(), group, error)) {
    if (error.empty()) broken("a demand file refused without a message");
    return 0;
  }
  const int device = static_cast<int>(now_ns % kMaxDevices);
  demand.stamp(device, now_ns);
  (void)demand.others_active(device, now_ns, 1'000'000);
  demand.add_high_work(device, now_ns, now_ns % 1'000'000'000,
                       static_cast<std::uint32_t>(now_ns % 101));
  (void)demand.high_work_until(device, now_ns);
  (void)demand.high_tolerance_percent(device);
  (void)demand.place_low_work(device, now_ns, now_ns - now_ns % 3'000'000, now_ns % 5'000'000,
                              now_ns % 200'000);
  (void)demand.place_low_work(device, now_ns, 0, UINT64_MAX, UINT64_MAX);  // no sum may wrap
  return 0;
}
