// The mutex of code that runs inside other people's processes (the hook, the simulated
// driver): a pthread mutex, since std::mutex would pull in the C++ runtime, annotated so the
// compiler checks what it guards (common/thread_annotations.h). Host code uses base/mutex.h.
#pragma once

#include <pthread.h>

#include "common/scoped_lock.h"
#include "common/thread_annotations.h"

namespace tessera {

class CAPABILITY("mutex") Mutex {
 public:
  constexpr Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { pthread_mutex_lock(&native_); }
  void unlock() RELEASE() { pthread_mutex_unlock(&native_); }
  // In a forked child, where another thread of the parent may have held it: the child has
  // that one thread only, so the lock starts afresh.
  void reset_after_fork() { pthread_mutex_init(&native_, nullptr); }

 private:
  pthread_mutex_t native_ = PTHREAD_MUTEX_INITIALIZER;
};

// Holds a Mutex for its scope.
using MutexLock = ScopedLock<Mutex>;

}  // namespace tessera
