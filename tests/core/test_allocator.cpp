// The caching allocator: size classes, reuse, accounting, release and the out-of-memory path.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "backend/backend.h"
#include "core/allocator.h"
#include "tandem/error.h"
#include "tandem/tensor.h"

namespace tandem {
namespace {

// Counts raw allocations; fails the first `fail_next` requests to imitate an exhausted device.
struct RawCounter {
  int allocs = 0, frees = 0, fail_next = 0;
  size_t last_size = 0;
  CachingAllocator make() {
    return CachingAllocator(
        "test memory",
        [this](size_t n) -> void* {
          last_size = n;
          if (fail_next > 0) {
            --fail_next;
            return nullptr;
          }
          ++allocs;
          return std::malloc(n);
        },
        [this](void* p) {
          ++frees;
          std::free(p);
        });
  }
};

TEST(CachingAllocator, RoundsSizes) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1 << 20), size_t(1) << 20);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), size_t(2) << 20);
  EXPECT_EQ(CachingAllocator::round_size(size_t(3) << 20), size_t(4) << 20);
}

TEST(CachingAllocator, ReusesFreedBlocksOfTheSameClass) {
  RawCounter raw;
  {
    CachingAllocator a = raw.make();
    void* p = a.allocate(1000);
    EXPECT_EQ(a.bytes_in_use(), 1024u);
    a.deallocate(p, 1000);
    EXPECT_EQ(a.bytes_in_use(), 0u);
    EXPECT_EQ(a.bytes_cached(), 1024u);
    void* q = a.allocate(900);  // same 1024-byte class
    EXPECT_EQ(q, p);
    EXPECT_EQ(raw.allocs, 1);
    EXPECT_EQ(a.bytes_cached(), 0u);
    void* r = a.allocate(2000);  // another class: a new block
    EXPECT_NE(r, q);
    EXPECT_EQ(raw.allocs, 2);
    a.deallocate(q, 900);
    a.deallocate(r, 2000);
    EXPECT_EQ(a.bytes_cached(), 1024u + 2048u);
    a.release_cached();
    EXPECT_EQ(raw.frees, 2);
    EXPECT_EQ(a.bytes_cached(), 0u);
    void* s = a.allocate(100);
    a.deallocate(s, 100);
  }
  EXPECT_EQ(raw.frees, raw.allocs);  // the destructor returns what was cached
}

TEST(CachingAllocator, HandsOverCachedBlocksOfASizeClass) {
  RawCounter raw;
  CachingAllocator a = raw.make();
  void* p = a.allocate(3000);  // the 3072-byte class
  a.deallocate(p, 3000);
  EXPECT_EQ(a.take_cached(4096), nullptr);  // another class
  EXPECT_EQ(a.take_cached(2600), p);        // same class: handed over and forgotten
  EXPECT_EQ(a.bytes_cached(), 0u);
  EXPECT_EQ(a.take_cached(2600), nullptr);
  a.release_cached();
  EXPECT_EQ(raw.frees, 0);  // the taker frees it
  std::free(p);
}

TEST(CachingAllocator, RetriesAfterEmptyingTheCacheThenReportsOutOfMemory) {
  RawCounter raw;
  CachingAllocator a = raw.make();
  void* cached = a.allocate(4096);
  a.deallocate(cached, 4096);
  raw.fail_next = 1;  // the first attempt fails; the cache is released and the retry succeeds
  void* p = a.allocate(8192);
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(raw.frees, 1);
  EXPECT_EQ(a.bytes_cached(), 0u);
  raw.fail_next = 2;  // both attempts fail
  try {
    a.allocate(1 << 16);
    FAIL() << "no out-of-memory error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Runtime);
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test memory"), std::string::npos) << e.what();
  }
  a.deallocate(p, 8192);
}

TEST(CachingAllocator, TensorsRecycleCpuMemory) {
  backend::cpu_backend().allocator(0).release_cached();  // no older block of the same class to hand out
  void* first;
  {
    Tensor t = Tensor::empty({1000, 300});
    first = t.data_ptr();
  }
  Tensor u = Tensor::empty({300, 1000});  // same byte count: the cached block comes back
  EXPECT_EQ(u.data_ptr(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(u.data_ptr()) % 64, 0u);  // vector-aligned
}

}  // namespace
}  // namespace tandem
