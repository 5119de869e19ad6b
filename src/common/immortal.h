// Storage for a process-wide object that is built on first use and never destroyed.
// Libraries loaded into other processes must not run destructors at exit: another thread,
// or another library's exit handler, may still call into them.
#pragma once

#include <new>
#include <utility>

namespace tessera {

template <typename T>
class Immortal {
 public:
  template <typename... Args>
  T& construct(Args&&... args) {
    return *new (storage_) T(std::forward<Args>(args)...);
  }
  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace tessera
