// Holding a lock for a scope, for every annotated mutex Tessera has (common/mutex.h for guest
// code, base/mutex.h for host code): one class, so that the analysis sees each acquire and
// release the same way whatever the mutex. Guest-safe: header-only, no C++ runtime.
#pragma once

#include "common/thread_annotations.h"

namespace tessera {

// Holds `mutex` (exclusively) until the end of the scope.
template <typename Lockable>
class SCOPED_CAPABILITY ScopedLock {
 public:
  explicit ScopedLock(Lockable& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~ScopedLock() RELEASE() { mutex_.unlock(); }
  ScopedLock(const ScopedLock&) = delete;
  ScopedLock& operator=(const ScopedLock&) = delete;

 private:
  Lockable& mutex_;
};

}  // namespace tessera
