#include "common/shared_file.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common/bounded_format.h"

namespace tessera {
namespace {

constexpr off_t kLivenessBase = off_t{1} << 40;
// The byte just before the members' liveness locks marks a file kept in use.
constexpr int kUseIndex = -1;

bool set_size_and_map(int fd, std::size_t size, bool resize, SharedMapping& mapping,
                      const char* what, ErrorText& error) {
  if (resize && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return error.set("%s: cannot size to %zu bytes: %s", what, size, std::strerror(errno));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return error.set("%s: cannot map: %s", what, std::strerror(errno));
  }
  mapping.fd = fd;
  mapping.base = base;
  mapping.size = size;
  return true;
}

bool create_by_link(const char* path, std::size_t size, InitializeShared initialize,
                    const void* context, ErrorText& error) {
  char temporary[4096];
  if (!format_bounded(temporary, sizeof temporary, error, "%s.tmp.%d", path,
                      static_cast<int>(getpid()))) {
    return false;
  }
  const int fd = open(temporary, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return error.set("%s: cannot create: %s", path, std::strerror(errno));
  SharedMapping staging;
  bool ok = set_size_and_map(fd, size, true, staging, path, error);
  if (!ok) {
    ::close(fd);
  } else {
    initialize(staging.base, context);
    // link() fails if another process won the race; its file is as good as ours.
    if (link(temporary, path) != 0 && errno != EEXIST) {
      ok = error.set("%s: cannot create: %s", path, std::strerror(errno));
    }
    staging.close();
  }
  unlink(temporary);
  return ok;
}

void unguard(const SharedMapping& mapping);

}  // namespace

void SharedMapping::close() {
  unguard(*this);
  if (base != nullptr) munmap(base, size);
  if (fd >= 0) ::close(fd);
  base = nullptr;
  fd = -1;
  size = 0;
}

bool map_shared_file(const char* path, std::size_t size, InitializeShared initialize,
                     const void* context, SharedMapping& mapping, ErrorText& error) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && initialize != nullptr) {
    if (!create_by_link(path, size, initialize, context, error)) return false;
    fd = open(path, O_RDWR | O_CLOEXEC);
  }
  if (fd < 0) return error.set("%s: cannot open: %s", path, std::strerror(errno));
  struct stat status {};
  if (fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(fd);
    return error.set("%s: not a regular file", path);
  }
  if (static_cast<std::size_t>(status.st_size) != size) {
    ::close(fd);
    return error.set(
        "%s: is %lld bytes, expected %zu: truncated, or not a Tessera file of this "
        "version",
        path, static_cast<long long>(status.st_size), size);
  }
  if (!set_size_and_map(fd, size, false, mapping, path, error)) {
    ::close(fd);
    return false;
  }
  return true;
}

bool map_private_shared(const char* name, std::size_t size, InitializeShared initialize,
                        const void* context, SharedMapping& mapping, ErrorText& error) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return error.set("%s: memfd_create failed: %s", name, std::strerror(errno));
  if (!set_size_and_map(fd, size, true, mapping, name, error)) {
    ::close(fd);
    return false;
  }
  initialize(mapping.base, context);
  return true;
}

void initialize_robust_mutex(RobustMutex* mutex) {
  pthread_mutexattr_t attributes;
  pthread_mutexattr_init(&attributes);
  pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&mutex->native, &attributes);
  pthread_mutexattr_destroy(&attributes);
}

bool robust_mutex_intact(const RobustMutex* mutex) {
#ifdef __GLIBC__
  // The type glibc records in a mutex it initialised as initialize_robust_mutex does.
  static const int kind = [] {
    RobustMutex reference;
    initialize_robust_mutex(&reference);
    const int value = reference.native.__data.__kind;
    pthread_mutex_destroy(&reference.native);
    return value;
  }();
  return __atomic_load_n(&mutex->native.__data.__kind, __ATOMIC_RELAXED) == kind;
#else
  (void)mutex;
  return true;
#endif
}

LockOutcome lock_robust(RobustMutex* robust, int timeout_ms) {
  pthread_mutex_t* mutex = &robust->native;
  int result = 0;
  if (timeout_ms < 0) {
    result = pthread_mutex_lock(mutex);
  } else if (result = pthread_mutex_trylock(mutex); result == EBUSY) {  // uncontended: no clock
    timespec deadline{};
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += static_cast<long>(timeout_ms % 1000) * 1'000'000;
    if (deadline.tv_nsec >= 1'000'000'000) {
      deadline.tv_sec += 1;
      deadline.tv_nsec -= 1'000'000'000;
    }
    result = pthread_mutex_clocklock(mutex, CLOCK_MONOTONIC, &deadline);
  }
  switch (result) {
    case 0:
      return LockOutcome::acquired;
    case EOWNERDEAD:
      pthread_mutex_consistent(mutex);
      return LockOutcome::previous_owner_died;
    case ETIMEDOUT:
      return LockOutcome::timed_out;
    default:
      return LockOutcome::failed;
  }
}

// The analysis takes these two on their word: they are the primitives it is told about.
void lock_robust_whole(RobustMutex* mutex) NO_THREAD_SAFETY_ANALYSIS {
  lock_robust(mutex);  // held unless the lock is unusable, which unlocking then leaves alone
}

void unlock_robust(RobustMutex* mutex) NO_THREAD_SAFETY_ANALYSIS {
  pthread_mutex_unlock(&mutex->native);
}

namespace {
struct flock byte_lock(short type, int index) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = kLivenessBase + index;
  lock.l_len = 1;
  return lock;
}
}  // namespace

bool take_liveness_lock(int fd, int index) {
  struct flock lock = byte_lock(F_WRLCK, index);
  return fcntl(fd, F_OFD_SETLK, &lock) == 0;
}

void drop_liveness_lock(int fd, int index) {
  struct flock lock = byte_lock(F_UNLCK, index);
  fcntl(fd, F_OFD_SETLK, &lock);
}

bool liveness_lock_held_by_other(int fd, int index) {
  struct flock lock = byte_lock(F_WRLCK, index);
  if (fcntl(fd, F_OFD_GETLK, &lock) != 0) return true;  // cannot tell: assume alive
  return lock.l_type != F_UNLCK;
}

bool hold_shared_use(int fd) {
  struct flock lock = byte_lock(F_RDLCK, kUseIndex);
  int result = 0;
  while ((result = fcntl(fd, F_OFD_SETLKW, &lock)) != 0 && errno == EINTR) {
  }
  return result == 0;
}

bool try_exclusive_use(int fd) {
  struct flock lock = byte_lock(F_WRLCK, kUseIndex);
  return fcntl(fd, F_OFD_SETLK, &lock) == 0;
}

bool names_open_file(const char* path, int fd) {
  struct stat named {
  }, open_file{};
  return stat(path, &named) == 0 && fstat(fd, &open_file) == 0 &&
         named.st_dev == open_file.st_dev && named.st_ino == open_file.st_ino;
}

namespace {

// Guarded mappings, found by the SIGBUS handler without locks. A slot's base is 0 when
// free and kClaimed while its size changes, so the handler sees whole entries only.
struct GuardedRange {
  std::atomic<std::uintptr_t> base{0};
  std::atomic<std::size_t> size{0};
};
// A ledger and up to kMostDevices coordination files per process, and room beside.
constexpr int kGuardedRanges = 40;
constexpr std::uintptr_t kClaimed = 1;
GuardedRange guarded[kGuardedRanges];
struct sigaction previous_sigbus {};
std::atomic<bool> sigbus_handler_installed{false};

void on_sigbus(int signal_number, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (GuardedRange& range : guarded) {
    const std::uintptr_t base = range.base.load(std::memory_order_acquire);
    const std::size_t size = range.size.load(std::memory_order_relaxed);
    if (base <= kClaimed || address < base || address - base >= size) continue;
    // Zeroes in place of the file: the instruction that faulted runs again and reads them.
    void* replaced = mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (replaced != MAP_FAILED) return;
  }
  if ((previous_sigbus.sa_flags & SA_SIGINFO) != 0 && previous_sigbus.sa_sigaction != nullptr) {
    previous_sigbus.sa_sigaction(signal_number, info, context);
  } else if (previous_sigbus.sa_handler != SIG_DFL && previous_sigbus.sa_handler != SIG_IGN) {
    previous_sigbus.sa_handler(signal_number);
  } else {
    signal(SIGBUS, SIG_DFL);  // the fault happens again on return, and takes its course
  }
}

void unguard(const SharedMapping& mapping) {
  const auto base = reinterpret_cast<std::uintptr_t>(mapping.base);
  if (base == 0) return;
  for (GuardedRange& range : guarded) {
    std::uintptr_t expected = base;
    if (range.base.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) {
      range.size.store(0, std::memory_order_relaxed);
      range.base.store(0, std::memory_order_release);
      return;
    }
  }
}

}  // namespace

void guard_against_truncation(const SharedMapping& mapping) {
  const auto base = reinterpret_cast<std::uintptr_t>(mapping.base);
  if (base == 0) return;
  if (!sigbus_handler_installed.exchange(true)) {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_sigbus);
  }
  for (GuardedRange& range : guarded) {
    std::uintptr_t expected = 0;
    if (!range.base.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) {
      continue;
    }
    range.size.store(mapping.size, std::memory_order_relaxed);
    range.base.store(base, std::memory_order_release);
    return;
  }
}

void SharedMapping::reopen_in_child() {
  if (fd < 0) return;
  char path[64];
  // Hand-formatted: snprintf is not async-signal-safe.
  const char prefix[] = "/proc/self/fd/";
  std::memcpy(path, prefix, sizeof prefix - 1);
  char digits[16];
  int length = 0;
  for (unsigned value = static_cast<unsigned>(fd); length == 0 || value != 0; value /= 10) {
    digits[length++] = static_cast<char>('0' + value % 10);
  }
  for (int i = 0; i < length; ++i) path[sizeof prefix - 1 + i] = digits[length - 1 - i];
  path[sizeof prefix - 1 + length] = '\0';
  const int fresh = open(path, O_RDWR | O_CLOEXEC);
  if (fresh < 0) return;
  dup3(fresh, fd, O_CLOEXEC);
  ::close(fresh);
  mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
}

}  // namespace tessera
