// The mutexes of host code (the node agent, the extender, the CLI), annotated so the compiler
// checks what each guards (common/thread_annotations.h), with the condition variable that
// waits on them. Guest code (the hook, the simulated driver) uses common/mutex.h.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "common/scoped_lock.h"
#include "common/thread_annotations.h"

namespace tessera::base {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { native_.lock(); }
  void unlock() RELEASE() { native_.unlock(); }

 private:
  friend class CondVar;
  std::mutex native_;
};

// Holds a Mutex for its scope.
using MutexLock = ScopedLock<Mutex>;

// Many readers or one writer.
class CAPABILITY("shared mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() ACQUIRE() { native_.lock(); }
  void unlock() RELEASE() { native_.unlock(); }
  void lock_shared() ACQUIRE_SHARED() { native_.lock_shared(); }
  void unlock_shared() RELEASE_SHARED() { native_.unlock_shared(); }

 private:
  std::shared_mutex native_;
};

// Holds a SharedMutex alone: no reader, no other writer.
using WriterLock = ScopedLock<SharedMutex>;

class SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mutex) ACQUIRE_SHARED(mutex) : mutex_(mutex) {
    mutex_.lock_shared();
  }
  ~ReaderLock() RELEASE() { mutex_.unlock_shared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mutex_;
};

// A condition variable. Each wait names the Mutex it needs held, so the analysis checks it;
// that Mutex is held again when the wait returns. Every wait on one CondVar passes the same.
class CondVar {
 public:
  // False when `deadline` passed without a signal.
  template <typename Clock, typename Duration>
  bool wait_until(Mutex& mutex, std::chrono::time_point<Clock, Duration> deadline) REQUIRES(mutex) {
    std::unique_lock<std::mutex> relocked(mutex.native_, std::adopt_lock);
    const bool signalled = native_.wait_until(relocked, deadline) == std::cv_status::no_timeout;
    relocked.release();
    return signalled;
  }
  void notify_one() { native_.notify_one(); }
  void notify_all() { native_.notify_all(); }

 private:
  std::condition_variable native_;
};

}  // namespace tessera::base
