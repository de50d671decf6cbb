// Recording device work into CUDA graphs and replaying it. While a recording is under way on a
// thread, that thread's allocations on the device come from a pool private to the recording (its
// blocks taken from the device allocator's cache where it has them, else newly allocated): the
// addresses the graph holds are never handed to other tensors, so work queued between replays (the
// next batch's upload, an evaluation) cannot overwrite what a replay reads, nor a replay what it wrote.
#include <algorithm>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace tandem::backend {

namespace {

thread_local Allocator* t_pool = nullptr;
thread_local int t_pool_device = -1;

struct Pool {
  int device = 0;
  std::unique_ptr<CachingAllocator> alloc;
};

// Pools outlive their recordings: tensors allocated during a recording may still be held after the
// graph is gone, and return their blocks to the pool when released. The list is never destroyed,
// so no CUDA call runs at process exit.
std::mutex g_pools_mu;
std::vector<std::shared_ptr<Pool>>& pools() {
  static auto* list = new std::vector<std::shared_ptr<Pool>>();
  return *list;
}

// A pool first takes the blocks the device's own allocator has cached: a step recorded after eager
// steps of the same shapes finds there the very blocks it needs, so recording it costs little memory
// beyond what the eager steps held.
std::shared_ptr<Pool> new_pool(CudaBackend& be, int device) {
  auto pool = std::make_shared<Pool>();
  pool->device = device;
  pool->alloc = std::make_unique<CachingAllocator>(
      "cuda:" + std::to_string(device) + " memory of a recorded step",
      [&be, device](size_t n) -> void* {
        if (void* p = be.take_cached_block(device, n)) return p;
        cuda::set_device(device);
        void* p = nullptr;
        cudaError_t err = cudaMalloc(&p, n);
        if (err == cudaErrorMemoryAllocation) {
          (void)cudaGetLastError();
          return nullptr;
        }
        if (err != cudaSuccess) cuda::throw_cuda_error(err, "cudaMalloc", __FILE__, __LINE__);
        return p;
      },
      [device](void* p) {
        cuda::set_device(device);
        TANDEM_CUDA_CHECK(cudaStreamSynchronize(cuda::compute_stream(device)));
        TANDEM_CUDA_CHECK(cudaFree(p));
      });
  std::lock_guard<std::mutex> lock(g_pools_mu);
  pools().push_back(pool);
  return pool;
}

class CudaCapturedWork final : public CapturedWork {
 public:
  CudaCapturedWork(int device, cudaStream_t stream, cudaGraph_t graph, cudaGraphExec_t exec,
                   std::shared_ptr<Pool> pool)
      : device_(device), stream_(stream), graph_(graph), exec_(exec), pool_(std::move(pool)) {}

  ~CudaCapturedWork() override {
    cuda::set_device(device_);
    // A replay may still be running.
    cudaError_t err = cudaStreamSynchronize(stream_);
    if (err == cudaSuccess) {
      cudaGraphExecDestroy(exec_);
      cudaGraphDestroy(graph_);
    }
    (void)cudaGetLastError();
    // Blocks still held by tensors come back to the pool later and stay cached there.
    if (err == cudaSuccess) pool_->alloc->release_cached();
  }

  void replay() override {
    cuda::set_device(device_);
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
  }

  size_t pool_bytes() const override { return pool_->alloc->bytes_in_use() + pool_->alloc->bytes_cached(); }

 private:
  int device_;
  cudaStream_t stream_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  std::shared_ptr<Pool> pool_;
};

// Ends the recording whatever happens in the body, and leaves the thread's allocations to the
// device's own allocator again.
struct Recording {
  cudaStream_t stream;
  bool open = true;
  cudaGraph_t end() {
    open = false;
    t_pool = nullptr;
    t_pool_device = -1;
    cudaGraph_t graph = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream, &graph);
    if (err != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      cuda::throw_cuda_error(err, "cudaStreamEndCapture", __FILE__, __LINE__);
    }
    return graph;
  }
  ~Recording() {
    if (!open) return;
    t_pool = nullptr;
    t_pool_device = -1;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
  }
};

}  // namespace

Allocator* capture_pool(int device) { return t_pool_device == device ? t_pool : nullptr; }

bool CudaBackend::recording(int device) { return capture_pool(device) != nullptr; }

std::unique_ptr<CapturedWork> CudaBackend::capture(int device, const std::function<void()>& body) {
  DeviceState& st = state(device);
  TANDEM_CHECK(t_pool == nullptr, "a recording is already under way on this thread (recordings do not nest)");
  std::shared_ptr<Pool> pool = new_pool(*this, device);
  // Relaxed mode: the pool may call cudaMalloc while recording, and other threads (the data
  // loader's, the communicator's) go on as usual. A wait for the recording stream still fails.
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(st.stream, cudaStreamCaptureModeRelaxed));
  Recording rec{st.stream};
  t_pool = pool->alloc.get();
  t_pool_device = device;
  launch_count_replay(st.replays, st.stream);
  body();
  cudaGraph_t graph = rec.end();
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    cudaGraphDestroy(graph);
    cuda::throw_cuda_error(err, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  return std::make_unique<CudaCapturedWork>(device, st.stream, graph, exec, std::move(pool));
}

size_t CudaBackend::captured_pool_bytes(int device) {
  std::lock_guard<std::mutex> lock(g_pools_mu);
  size_t total = 0;
  for (const auto& p : pools())
    if (p->device == device) total += p->alloc->bytes_in_use() + p->alloc->bytes_cached();
  return total;
}

size_t CudaBackend::captured_pool_peak_bytes(int device) {
  std::lock_guard<std::mutex> lock(g_pools_mu);
  size_t total = 0;
  for (const auto& p : pools())
    if (p->device == device) total += p->alloc->peak_bytes_in_use();
  return total;
}

}  // namespace tandem::backend
