// An open-addressing hash map from a 64-bit handle (device pointer, array, pool, VMM
// handle) to a small trivially-copyable value. Storage comes from calloc, so it is usable
// in the hook, which must not depend on the host's C++ runtime. Not thread-safe: the
// owner serialises access.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <type_traits>

namespace tessera {

template <typename Value>
class HandleTable {
  static_assert(std::is_trivially_copyable_v<Value>);

 public:
  HandleTable() = default;
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;
  ~HandleTable() { std::free(entries_); }

  // Inserts or replaces; false only when memory for growth cannot be had.
  bool put(std::uint64_t key, const Value& value) {
    if ((used_ + 1) * 2 > capacity_ && !grow()) return false;
    Entry* slot = probe(key);
    if (slot->state != kFull) {
      if (slot->state == kEmpty) ++used_;
      ++size_;
      slot->state = kFull;
      slot->key = key;
    }
    slot->value = value;
    return true;
  }

  Value* find(std::uint64_t key) {
    if (capacity_ == 0) return nullptr;
    Entry* slot = probe(key);
    return slot->state == kFull ? &slot->value : nullptr;
  }

  // Removes key, copying its value out; false if absent.
  bool take(std::uint64_t key, Value& value) {
    if (capacity_ == 0) return false;
    Entry* slot = probe(key);
    if (slot->state != kFull) return false;
    value = slot->value;
    slot->state = kTombstone;
    --size_;
    return true;
  }

  template <typename Visit>
  void for_each(Visit visit) {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (entries_[i].state == kFull) visit(entries_[i].key, entries_[i].value);
    }
  }

  // Forgets everything without freeing (used in a forked child, where the parent's
  // handles mean nothing).
  void clear() {
    for (std::size_t i = 0; i < capacity_; ++i) entries_[i].state = kEmpty;
    size_ = used_ = 0;
  }

  std::size_t size() const { return size_; }

 private:
  enum State : std::uint8_t { kEmpty = 0, kFull = 1, kTombstone = 2 };
  struct Entry {
    std::uint64_t key;
    Value value;
    State state;
  };

  static std::uint64_t mix(std::uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return key;
  }

  // The entry holding key, or else the first reusable entry on its probe path.
  Entry* probe(std::uint64_t key) {
    const std::size_t mask = capacity_ - 1;
    Entry* reusable = nullptr;
    for (std::size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      Entry& entry = entries_[i];
      if (entry.state == kEmpty) return reusable != nullptr ? reusable : &entry;
      if (entry.state == kTombstone) {
        if (reusable == nullptr) reusable = &entry;
      } else if (entry.key == key) {
        return &entry;
      }
    }
  }

  bool grow() {
    const std::size_t new_capacity =
        capacity_ == 0 ? 64 : (size_ * 4 > capacity_ ? capacity_ * 2 : capacity_);
    auto* fresh = static_cast<Entry*>(std::calloc(new_capacity, sizeof(Entry)));
    if (fresh == nullptr) return false;
    Entry* old = entries_;
    const std::size_t old_capacity = capacity_;
    entries_ = fresh;
    capacity_ = new_capacity;
    size_ = used_ = 0;
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].state == kFull) put(old[i].key, old[i].value);
    }
    std::free(old);
    return true;
  }

  Entry* entries_ = nullptr;
  std::size_t capacity_ = 0;  // a power of two
  std::size_t size_ = 0;      // full entries
  std::size_t used_ = 0;      // full and tombstone entries
};

}  // namespace tessera
