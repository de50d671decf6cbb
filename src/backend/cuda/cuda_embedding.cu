// CUDA kernels: embedding lookups and their gradient.
//
// The lookup copies whole rows in the widest words the row size allows. An index outside [0, rows)
// cannot be reported without a host sync: its output row is zeros and the kernel records the index in
// the device's error record, which the next synchronisation (copy_to_host, synchronize) throws.
//
// The gradient has two ways of adding the rows of equal indices:
//  - atomics (the default): every row of dy is added into an f32 accumulator with atomicAdd, straight
//    into the gradient for f32 weights, into f32 scratch for 16-bit ones (then converted once); the
//    order of the additions varies from run to run;
//  - deterministic (set_deterministic_algorithms): the indices are sorted with their positions by a
//    stable radix sort (CUB), and one block per run of equal indices adds that run's rows in position
//    order, in f32. That is the CPU's order, so f32 results equal the CPU's bit for bit.
#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {

using kern::blocks_for;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;

__device__ void report_index(ErrorSink sink, int64_t position, int64_t index, int64_t rows) {
  if (atomicCAS(sink.claim, 0, 1) != 0) return;  // another thread already reported
  sink.rec->row = position;
  sink.rec->label = index;
  sink.rec->classes = rows;
  sink.rec->kind = 1;
  __threadfence_system();
  sink.rec->flag = 1;
}

// out[i] = weight[indices[i]], rows of `words` Words each.
template <typename Word, typename Index>
__global__ void gather_rows_kernel(const Word* __restrict__ weight, const Index* __restrict__ indices,
                                   Word* __restrict__ out, int64_t n, int64_t words, int64_t rows, ErrorSink sink) {
  const int64_t total = n * words;
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t i = e / words, w = e - i * words;
    const int64_t r = static_cast<int64_t>(indices[i]);
    if (r < 0 || r >= rows) {
      if (w == 0) report_index(sink, i, r, rows);
      out[e] = Word{};
      continue;
    }
    out[e] = weight[r * words + w];
  }
}

// acc[indices[i]] += dy[i] with f32 atomics; indices outside [0, rows) add nothing.
template <typename T, typename Index>
__global__ void scatter_add_kernel(const T* __restrict__ dy, const Index* __restrict__ indices, float* __restrict__ acc,
                                   int64_t n, int64_t d, int64_t rows) {
  const int64_t total = n * d;
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t i = e / d, c = e - i * d;
    const int64_t r = static_cast<int64_t>(indices[i]);
    if (r < 0 || r >= rows) continue;
    atomicAdd(acc + r * d + c, kern::to_float(dy[e]));
  }
}

template <typename T>
__global__ void f32_to_kernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  for (int64_t e = thread_index(); e < n; e += thread_count()) out[e] = kern::from_float<T>(in[e]);
}

// Sort keys (rows outside [0, rows) become `rows`, a key past every real one) and positions.
template <typename Index>
__global__ void sort_input_kernel(const Index* __restrict__ indices, unsigned* __restrict__ keys,
                                  unsigned* __restrict__ positions, int64_t n, int64_t rows) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    const int64_t r = static_cast<int64_t>(indices[i]);
    keys[i] = static_cast<unsigned>(r < 0 || r >= rows ? rows : r);
    positions[i] = static_cast<unsigned>(i);
  }
}

// One block per run of equal sorted keys (found at its first element), threads over the columns: the
// run's rows of dy added in position order.
template <typename T>
__global__ void segment_sum_kernel(const T* __restrict__ dy, const unsigned* __restrict__ keys,
                                   const unsigned* __restrict__ positions, T* __restrict__ dw, int64_t n, int64_t d,
                                   int64_t rows) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    const unsigned key = keys[s];
    if (key >= rows || (s > 0 && keys[s - 1] == key)) continue;
    int64_t end = s + 1;
    while (end < n && keys[end] == key) ++end;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      float acc = 0.0f;
      for (int64_t k = s; k < end; ++k) acc += kern::to_float(dy[static_cast<int64_t>(positions[k]) * d + c]);
      dw[static_cast<int64_t>(key) * d + c] = kern::from_float<T>(acc);
    }
  }
}

template <typename F>
void dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    default: TANDEM_CHECK(false, op, ": indices must be i32 or i64, got ", dtype_name(t));
  }
}

template <typename Word, typename Index>
void launch_gather(const Tensor& weight, const Tensor& indices, Tensor& out, int64_t words, const DeviceState& st) {
  const int64_t n = indices.numel();
  gather_rows_kernel<Word, Index><<<blocks_for(n * words), kBlock, 0, st.stream>>>(
      static_cast<const Word*>(weight.data_ptr()), static_cast<const Index*>(indices.data_ptr()),
      static_cast<Word*>(out.data_ptr()), n, words, weight.size(0), st.errors);
  TANDEM_CUDA_LAUNCH_CHECK("gather_rows_kernel");
}

int bits_for(int64_t v) {  // bits that hold every value in [0, v]
  int b = 1;
  while (b < 32 && (int64_t(1) << b) <= v) ++b;
  return b;
}

}  // namespace

void CudaBackend::embedding_forward(const Tensor& weight, const Tensor& indices, Tensor& out) {
  DeviceState& st = state_for(weight);
  kern::dispatch_float(weight.dtype(), "embedding", [](auto) {});
  const int64_t n = indices.numel(), d = weight.size(1);
  if (n == 0 || d == 0) return;
  const size_t row_bytes = static_cast<size_t>(d) * dtype_size(weight.dtype());
  auto aligned = [&](size_t a) {
    return row_bytes % a == 0 && reinterpret_cast<uintptr_t>(weight.data_ptr()) % a == 0 &&
           reinterpret_cast<uintptr_t>(out.data_ptr()) % a == 0;
  };
  dispatch_index(indices.dtype(), "embedding", [&](auto itag) {
    using Index = decltype(itag);
    if (aligned(16))
      launch_gather<uint4, Index>(weight, indices, out, static_cast<int64_t>(row_bytes / 16), st);
    else if (aligned(4))
      launch_gather<uint32_t, Index>(weight, indices, out, static_cast<int64_t>(row_bytes / 4), st);
    else
      launch_gather<uint16_t, Index>(weight, indices, out, static_cast<int64_t>(row_bytes / 2), st);
  });
}

void CudaBackend::embedding_backward(const Tensor& dy, const Tensor& indices, bool deterministic, Tensor& dweight) {
  DeviceState& st = state_for(dweight);
  TANDEM_CHECK(dy.dtype() == dweight.dtype(), "embedding backward: gradient ", dy.str(), " and weight gradient ",
               dweight.str(), " differ in dtype");
  const int64_t n = indices.numel(), rows = dweight.size(0), d = dweight.size(1);
  if (dweight.numel() == 0) return;
  TANDEM_CUDA_CHECK(cudaMemsetAsync(dweight.data_ptr(), 0, dweight.nbytes(), st.stream));
  if (n == 0) return;
  TANDEM_CHECK(n < INT_MAX && rows < INT_MAX, "embedding backward: ", n, " indices into ", rows,
               " rows is more than the CUDA kernels take (2^31 - 1)");
  kern::dispatch_float(dweight.dtype(), "embedding backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(dy.data_ptr());
    T* dw = static_cast<T*>(dweight.data_ptr());
    dispatch_index(indices.dtype(), "embedding backward", [&](auto itag) {
      using Index = decltype(itag);
      const Index* idx = static_cast<const Index*>(indices.data_ptr());
      if (!deterministic) {
        if constexpr (std::is_same_v<T, float>) {
          scatter_add_kernel<T, Index><<<blocks_for(n * d), kBlock, 0, st.stream>>>(g, idx, dw, n, d, rows);
          TANDEM_CUDA_LAUNCH_CHECK("scatter_add_kernel");
        } else {
          const int64_t total = rows * d;
          Scratch acc(allocator(st.device), static_cast<size_t>(total) * sizeof(float));
          TANDEM_CUDA_CHECK(cudaMemsetAsync(acc.as<float>(), 0, static_cast<size_t>(total) * sizeof(float), st.stream));
          scatter_add_kernel<T, Index><<<blocks_for(n * d), kBlock, 0, st.stream>>>(g, idx, acc.as<float>(), n, d, rows);
          TANDEM_CUDA_LAUNCH_CHECK("scatter_add_kernel");
          f32_to_kernel<T><<<blocks_for(total), kBlock, 0, st.stream>>>(acc.as<float>(), dw, total);
          TANDEM_CUDA_LAUNCH_CHECK("f32_to_kernel");
        }
        return;
      }
      // keys and positions in, sorted keys and positions out, then CUB's temporary storage.
      Scratch buf(allocator(st.device), static_cast<size_t>(4 * n) * sizeof(unsigned));
      unsigned* keys_in = buf.as<unsigned>();
      unsigned* pos_in = keys_in + n;
      unsigned* keys_out = pos_in + n;
      unsigned* pos_out = keys_out + n;
      sort_input_kernel<Index><<<blocks_for(n), kBlock, 0, st.stream>>>(idx, keys_in, pos_in, n, rows);
      TANDEM_CUDA_LAUNCH_CHECK("sort_input_kernel");
      const int end_bit = bits_for(rows);
      size_t temp_bytes = 0;
      TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in, pos_out,
                                                        static_cast<int>(n), 0, end_bit, st.stream));
      temp_bytes = std::max<size_t>(temp_bytes, 16);
      Scratch temp(allocator(st.device), temp_bytes);
      TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, keys_out, pos_in,
                                                        pos_out, static_cast<int>(n), 0, end_bit, st.stream));
      const int threads = static_cast<int>(std::clamp<int64_t>((d + 31) / 32 * 32, 32, kBlock));
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, kern::kMaxBlocks));
      segment_sum_kernel<T><<<blocks, threads, 0, st.stream>>>(g, keys_out, pos_out, dw, n, d, rows);
      TANDEM_CUDA_LAUNCH_CHECK("segment_sum_kernel");
    });
  });
}

// f32 without deterministic: the atomics add into the gradient there (the sums in any order, as above).
bool CudaBackend::embedding_backward_add(const Tensor& dy, const Tensor& indices, bool deterministic,
                                         Tensor& dweight) {
  if (deterministic || dweight.dtype() != DType::f32 || dy.dtype() != DType::f32 || !dweight.is_contiguous())
    return false;
  DeviceState& st = state_for(dweight);
  const int64_t n = indices.numel(), rows = dweight.size(0), d = dweight.size(1);
  if (dweight.numel() == 0 || n == 0) return true;
  TANDEM_CHECK(n < INT_MAX && rows < INT_MAX, "embedding backward: ", n, " indices into ", rows,
               " rows is more than the CUDA kernels take (2^31 - 1)");
  const float* g = dy.data<float>();
  float* dw = dweight.data<float>();
  dispatch_index(indices.dtype(), "embedding backward", [&](auto itag) {
    using Index = decltype(itag);
    scatter_add_kernel<float, Index><<<blocks_for(n * d), kBlock, 0, st.stream>>>(
        g, static_cast<const Index*>(indices.data_ptr()), dw, n, d, rows);
    TANDEM_CUDA_LAUNCH_CHECK("scatter_add_kernel");
  });
  return true;
}

}  // namespace tandem::backend
