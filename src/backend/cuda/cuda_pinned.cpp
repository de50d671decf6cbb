// Page-locked host memory whose blocks are reused only after the uploads that read them finished.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace tandem::backend {

bool PinnedAllocator::ready(Block& b) {
  for (size_t d = 0; d < b.events.size(); ++d) {
    if (!b.pending[d]) continue;
    cudaError_t err = cudaEventQuery(b.events[d]);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    if (err != cudaSuccess) cuda::throw_cuda_error(err, "cudaEventQuery", __FILE__, __LINE__);
    b.pending[d] = false;
  }
  return true;
}

void* PinnedAllocator::allocate(size_t nbytes) {
  const size_t size = CachingAllocator::round_size(nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [lo, hi] = free_.equal_range(size);
    for (auto it = lo; it != hi; ++it) {
      Block* b = it->second;
      if (!ready(*b)) continue;
      free_.erase(it);
      cached_ -= size;
      in_use_.emplace(b->ptr, b);
      return b->ptr;
    }
  }
  void* p = nullptr;
  cudaError_t err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    release_cached();
    err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      TANDEM_RUNTIME_CHECK(false, "pinned host memory: out of memory allocating ", size, " bytes");
    }
  }
  if (err != cudaSuccess) cuda::throw_cuda_error(err, "cudaHostAlloc", __FILE__, __LINE__);
  auto* b = new Block;
  b->ptr = p;
  b->size = size;
  std::lock_guard<std::mutex> lock(mu_);
  in_use_.emplace(p, b);
  return p;
}

// Runs from tensor destructors, so it must not throw: a block whose release cannot be recorded (a
// broken device) is never handed out again rather than risk reuse under an in-flight copy.
void PinnedAllocator::deallocate(void* p, size_t) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(p);
  if (it == in_use_.end()) return;
  Block* b = it->second;
  in_use_.erase(it);
  if (b->events.empty()) {
    b->events.assign(static_cast<size_t>(device_count_), nullptr);
    b->pending.assign(static_cast<size_t>(device_count_), false);
  }
  const int prev = cuda::cached_device();
  bool ok = true;
  for (int d = 0; d < device_count_ && ok; ++d) {
    if (!cuda::stream_created(d)) continue;  // nothing was ever queued on that device
    try {
      cudaEvent_t& ev = b->events[static_cast<size_t>(d)];
      if (!ev) {
        cuda::set_device(d);  // an event belongs to the device current at its creation
        TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      }
      TANDEM_CUDA_CHECK(cudaEventRecord(ev, cuda::compute_stream(d)));
      b->pending[static_cast<size_t>(d)] = true;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  try {
    if (prev >= 0) cuda::set_device(prev);
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok) return;  // leaked on purpose
  free_.emplace(b->size, b);
  cached_ += b->size;
}

void PinnedAllocator::free_block(Block* b) {
  for (cudaEvent_t ev : b->events)
    if (ev) TANDEM_CUDA_CHECK(cudaEventDestroy(ev));
  TANDEM_CUDA_CHECK(cudaFreeHost(b->ptr));
  delete b;
}

void PinnedAllocator::release_cached() {
  std::vector<Block*> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end();) {
      if (ready(*it->second)) {
        done.push_back(it->second);
        cached_ -= it->first;
        it = free_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Block* b : done) free_block(b);
}

size_t PinnedAllocator::bytes_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

}  // namespace tandem::backend
