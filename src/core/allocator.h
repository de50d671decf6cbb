#pragma once
// Internal: caching allocators. Freed blocks are kept by size and handed out again, so the training
// loop does no cudaMalloc/cudaFree (or large malloc/free) after the first step.
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace tandem {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* p, size_t nbytes) = 0;
  /// Returns cached blocks to the system.
  virtual void release_cached() {}
};

/// Caches freed blocks by rounded size. raw_alloc may fail by returning null: the cache is then
/// emptied and the allocation retried once before out_of_memory is thrown.
class CachingAllocator : public Allocator {
 public:
  using RawAlloc = std::function<void*(size_t)>;
  using RawFree = std::function<void(void*)>;
  CachingAllocator(std::string name, RawAlloc raw_alloc, RawFree raw_free)
      : name_(std::move(name)), raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)) {}
  ~CachingAllocator() override;
  void* allocate(size_t nbytes) override;
  void deallocate(void* p, size_t nbytes) override;
  void release_cached() override;
  /// Hands over a cached block of nbytes' size class, which this allocator then forgets (the taker
  /// frees it), or null when none is cached.
  void* take_cached(size_t nbytes);
  /// Rounded size used for a request: multiples of 512 bytes, then of 2 MiB past 1 MiB.
  static size_t round_size(size_t nbytes);
  size_t bytes_in_use() const;
  size_t bytes_cached() const;
  /// The most bytes in use at once since construction or the last reset_peak().
  size_t peak_bytes_in_use() const;
  void reset_peak();

 private:
  void* pop_cached(size_t size);  // a cached block of exactly this rounded size, or null; mu_ held
  std::string name_;
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // rounded size -> block
  size_t in_use_ = 0;
  size_t peak_ = 0;
  size_t cached_ = 0;
};

}  // namespace tandem
