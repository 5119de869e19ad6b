// A device's coordination file (ledger/demand.h) as other groups may have written it: a valid
// file patched anywhere at the fuzzer's choice. Opening it refuses it with a message or gives a
// file whose stamps, claims and high-priority times are read without fault; a file refused is
// made whole by the node agent's repair, and then opens.
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
  std::string path;
  contract::DeviceKey key;
  std::vector<std::uint8_t> valid;

  Fixture() {
    char made[] = "/tmp/tessera-fuzz-demand-XXXXXX";
    if (mkdtemp(made) == nullptr) broken("no temporary directory");
    if (!contract::device_key_from_uuid("GPU-7e55e7a0-0000-4000-8000-000000000000", key)) {
      broken("no device key");
    }
    path = std::string(made) + "/" + key.text + contract::kCoordinationSuffix;
    Demand demand;
    ErrorText error;
    if (!demand.open(path.c_str(), key, 1, error)) broken(error.text);
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
  if (!demand.open(fixture.path.c_str(), fixture.key, group, error)) {
    if (error.empty()) broken("a coordination file refused without a message");
    bool repaired = false;
    if (!prepare_coordination_file(fixture.path.c_str(), fixture.key, repaired, error) ||
        !repaired || !demand.open(fixture.path.c_str(), fixture.key, group, error)) {
      broken("a coordination file written over was not made whole");
    }
  }
  demand.stamp(now_ns);
  (void)demand.others_active(now_ns, 1'000'000);
  demand.add_high_work(now_ns, now_ns % 1'000'000'000, static_cast<std::uint32_t>(now_ns % 101));
  (void)demand.high_work_until(now_ns);
  (void)demand.high_tolerance_percent();
  (void)demand.place_low_work(now_ns, now_ns - now_ns % 3'000'000, now_ns % 5'000'000,
                              now_ns % 200'000);
  (void)demand.place_low_work(now_ns, 0, UINT64_MAX, UINT64_MAX);  // no sum may wrap
  if (!demand.intact()) broken("a file just opened is not intact");
  return 0;
}
