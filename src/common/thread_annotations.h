// Clang's thread-safety annotations, so the compiler checks each lock rule the code states:
// what a mutex guards (GUARDED_BY), what a function needs held (REQUIRES) or must not hold
// (EXCLUDES), and the order of two locks (ACQUIRED_AFTER). The `thread-safety` preset builds
// everything with -Wthread-safety -Werror; other compilers see nothing.
// The names follow Clang's documentation (clang.llvm.org/docs/ThreadSafetyAnalysis.html).
#pragma once

#if defined(__clang__)
#define TESSERA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TESSERA_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(name) TESSERA_THREAD_ANNOTATION(capability(name))
#define SCOPED_CAPABILITY TESSERA_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(lock) TESSERA_THREAD_ANNOTATION(guarded_by(lock))
#define PT_GUARDED_BY(lock) TESSERA_THREAD_ANNOTATION(pt_guarded_by(lock))
#define ACQUIRED_AFTER(...) TESSERA_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) TESSERA_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define REQUIRES(...) TESSERA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) TESSERA_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) TESSERA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) TESSERA_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) TESSERA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) TESSERA_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) TESSERA_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) TESSERA_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) TESSERA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(lock) TESSERA_THREAD_ANNOTATION(assert_capability(lock))
#define RETURN_CAPABILITY(lock) TESSERA_THREAD_ANNOTATION(lock_returned(lock))
#define NO_THREAD_SAFETY_ANALYSIS TESSERA_THREAD_ANNOTATION(no_thread_safety_analysis)
