// The mutexes of host code (the node agent, the extender, the CLI), annotated so the compiler
// checks what each guards (common/thread_annotations.h), with the condition variable that
// waits on them. Guest code (the hook, the simulated driver) uses common/mutex.h.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

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
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

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

class SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~WriterLock() RELEASE() { mutex_.unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mutex_;
};

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
