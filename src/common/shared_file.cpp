#include "common/shared_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "common/bounded_format.h"

namespace tessera {
namespace {

constexpr off_t kLivenessBase = off_t{1} << 40;

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

}  // namespace

void SharedMapping::close() {
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

void initialize_robust_mutex(pthread_mutex_t* mutex) {
  pthread_mutexattr_t attributes;
  pthread_mutexattr_init(&attributes);
  pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(mutex, &attributes);
  pthread_mutexattr_destroy(&attributes);
}

LockOutcome lock_robust(pthread_mutex_t* mutex) {
  const int result = pthread_mutex_lock(mutex);
  if (result == EOWNERDEAD) {
    pthread_mutex_consistent(mutex);
    return LockOutcome::previous_owner_died;
  }
  return LockOutcome::acquired;
}

void unlock_robust(pthread_mutex_t* mutex) {
  pthread_mutex_unlock(mutex);
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
