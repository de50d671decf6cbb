#include "core/allocator.h"

#include <algorithm>

#include "tandem/error.h"

namespace tandem {

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20;
  if (nbytes <= (size_t(1) << 20)) return (nbytes + kSmall - 1) / kSmall * kSmall;
  return (nbytes + kLarge - 1) / kLarge * kLarge;
}

CachingAllocator::~CachingAllocator() {
  // Blocks still in use at exit belong to static tensors; the process is ending, leave them.
  release_cached();
}

void* CachingAllocator::allocate(size_t nbytes) {
  size_t size = round_size(nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (void* p = pop_cached(size)) {
      in_use_ += size;
      peak_ = std::max(peak_, in_use_);
      return p;
    }
  }
  void* p = raw_alloc_(size);
  if (!p) {
    release_cached();
    p = raw_alloc_(size);
  }
  TANDEM_RUNTIME_CHECK(p != nullptr, name_, ": out of memory allocating ", size, " bytes (", bytes_in_use(),
                       " bytes in use); try a smaller --batch-size");
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ += size;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void CachingAllocator::deallocate(void* p, size_t nbytes) {
  if (!p) return;
  size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace(size, p);
  in_use_ -= size;
  cached_ += size;
}

void* CachingAllocator::pop_cached(size_t size) {
  auto it = free_.find(size);
  if (it == free_.end()) return nullptr;
  void* p = it->second;
  free_.erase(it);
  cached_ -= size;
  return p;
}

void* CachingAllocator::take_cached(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return pop_cached(round_size(nbytes));
}

void CachingAllocator::release_cached() {
  std::multimap<size_t, void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(free_);
    cached_ = 0;
  }
  for (auto& [size, p] : blocks) raw_free_(p);
}

size_t CachingAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

size_t CachingAllocator::peak_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

size_t CachingAllocator::bytes_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

}  // namespace tandem
