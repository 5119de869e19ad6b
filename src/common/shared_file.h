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

void initialize_robust_mutex(pthread_mutex_t* mutex);

enum class LockOutcome { acquired, previous_owner_died };

// Locks; when the previous owner died holding the lock, returns previous_owner_died with
// the lock held, and the caller must repair the shared state before unlocking.
LockOutcome lock_robust(pthread_mutex_t* mutex);
void unlock_robust(pthread_mutex_t* mutex);

// Liveness locks on byte (kLivenessBase + index) of the file behind fd.
bool take_liveness_lock(int fd, int index);
void drop_liveness_lock(int fd, int index);
bool liveness_lock_held_by_other(int fd, int index);

}  // namespace tessera
