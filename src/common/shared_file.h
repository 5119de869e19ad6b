// Shared-memory files used by several processes at once (the ledger, the simulated GPU's
// state), and the two primitives that make them safe under kill -9:
//
// - a robust, process-shared mutex: if its owner dies, the next locker is told so and
//   repairs the state instead of waiting forever;
// - member liveness locks: each member holds an open-file-description (OFD) write lock
//   on one byte (beyond the end of the file) that the kernel drops when the process dies
//   or execs. Asking "is member i alive?" is asking whether that lock is held, which PID
//   reuse cannot fake.
#pragma once

#include <pthread.h>

#include <cstddef>

#include "common/error_text.h"
#include "common/thread_annotations.h"

namespace tessera {

struct SharedMapping {
  int fd = -1;
  void* base = nullptr;
  std::size_t size = 0;

  void close();
  // In a forked child: the inherited descriptor and mapping both reference the parent's
  // open file description, and with it the parent's liveness lock, which would then
  // outlive the parent. Gives the child a description of its own for both, at the same
  // address. Async-signal-safe.
  void reopen_in_child();
};

using InitializeShared = void (*)(void* base, const void* context);

// Maps `path`. If it does not exist and `initialize` is given, creates it by initialising
// a private temporary file and linking it into place, so no process ever sees a partly
// written file. The size must be exactly `size`: a shorter or longer file is refused.
bool map_shared_file(const char* path, std::size_t size, InitializeShared initialize,
                     const void* context, SharedMapping& mapping, ErrorText& error);

// Maps an anonymous shared file (memfd) of `size`, initialised by `initialize`.
bool map_private_shared(const char* name, std::size_t size, InitializeShared initialize,
                        const void* context, SharedMapping& mapping, ErrorText& error);

// A process-shared, robust mutex inside a shared file: a pthread mutex, laid out as one, that
// the thread-safety analysis knows as a lock.
struct CAPABILITY("mutex") RobustMutex {
  pthread_mutex_t native;
};
static_assert(sizeof(RobustMutex) == sizeof(pthread_mutex_t));

void initialize_robust_mutex(RobustMutex* mutex);
// False if the mutex no longer has the type initialize_robust_mutex gave it: written over
// by something else. Locking such a mutex can make glibc abort on an assertion.
bool robust_mutex_intact(const RobustMutex* mutex);

enum class LockOutcome { acquired, previous_owner_died, timed_out, failed };

// Locks; when the previous owner died holding the lock, returns previous_owner_died with
// the lock held, and the caller must repair the shared state before unlocking. With a
// timeout (milliseconds; negative: none) it gives up with timed_out: a live member holds
// the lock (one that is stopped) or its lock word was written over. `failed`: any other
// error (the lock not recoverable, or claimed by this very thread); the lock is not held.
// The analysis cannot follow an outcome: callers that must know it hold it through a function
// annotated TRY_ACQUIRE (MemberAccounts::lock).
LockOutcome lock_robust(RobustMutex* mutex, int timeout_ms = -1);
// Locks, with no timeout, state that a dead owner leaves whole (every value written in one
// store), so there is nothing to repair.
void lock_robust_whole(RobustMutex* mutex) ACQUIRE(*mutex);
void unlock_robust(RobustMutex* mutex) RELEASE(*mutex);

// Until the mapping is closed, a SIGBUS from touching it (the file was truncated under
// this process) replaces it with zeroes instead of killing the process, so the owner can
// notice the damage and refuse to go on. Other SIGBUSes go to the handler there was.
void guard_against_truncation(const SharedMapping& mapping);

// Keeping a file in use (for tessera run): while any process holds a shared use of a file,
// no other can take the exclusive use that removing it requires. Both on the open file
// description of fd, dropped with its last descriptor.
bool hold_shared_use(int fd);  // waits while another holds the exclusive use
bool try_exclusive_use(int fd);
// True if path still names the file open as fd.
bool names_open_file(const char* path, int fd);

// Liveness locks on byte (kLivenessBase + index) of the file behind fd.
bool take_liveness_lock(int fd, int index);
void drop_liveness_lock(int fd, int index);
bool liveness_lock_held_by_other(int fd, int index);

}  // namespace tessera
