// What the harnesses share: the fuzzer's bytes as a file some parsers insist on reading.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tessera::fuzz {

// A memory-backed file holding `size` bytes of `data`, named by a /proc path; closed on
// destruction.
class InputFile {
 public:
  InputFile(const std::uint8_t* data, std::size_t size) : fd_(memfd_create("fuzz-input", 0)) {
    if (fd_ < 0 || write(fd_, data, size) != static_cast<ssize_t>(size)) {
      std::perror("fuzz input file");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { close(fd_); }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// A harness found a property broken: stop with its reason, so the fuzzer keeps the input.
[[noreturn]] inline void broken(const char* property) {
  std::fprintf(stderr, "property broken: %s\n", property);
  std::abort();
}

}  // namespace tessera::fuzz
