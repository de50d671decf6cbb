// CUDA kernels: indexing along one extent of [outer, n, inner] views (selection, gathers, and scatters
// summed in a fixed order), padding, one-hot rows, nonzero positions and writes through strided views.
//
// Scatters that may meet the same destination twice never race: their (destination, source) pairs are
// sorted with a stable radix sort, and each destination then sums its sources in their order, so the
// result is the same on every run (and the CPU's, up to rounding). An index outside [-n, n) reads as 0
// (gathers) or is skipped (scatters), and is recorded in host-mapped memory; the next synchronisation
// throws it (check_index_errors).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <climits>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernel_utils.cuh"

namespace tandem::backend {

namespace {

using kern::blocks_for;
using kern::from_float;
using kern::kBlock;
using kern::thread_count;
using kern::thread_index;
using kern::to_float;

// ---- out-of-range indices, reported at the next synchronisation
enum IndexOp : int { kIndexSelect = 1, kIndexAdd, kGather, kScatter };

struct IndexErrorRecord {
  int flag;
  int op;
  long long index;
  long long extent;
};

constexpr int kMaxDevices = 64;

struct ErrorSlots {
  std::once_flag once[kMaxDevices];
  IndexErrorRecord* host[kMaxDevices] = {};
  IndexErrorRecord* dev[kMaxDevices] = {};
};

ErrorSlots& error_slots() {
  static auto* s = new ErrorSlots();  // never destroyed: kernels may hold the address until exit
  return *s;
}

IndexErrorRecord* device_error_record(int device) {
  TANDEM_CHECK(device >= 0 && device < kMaxDevices, "index kernels: cuda:", device, " is past the ", kMaxDevices,
               " devices supported");
  ErrorSlots& s = error_slots();
  std::call_once(s.once[device], [&] {
    void* rec = nullptr;
    TANDEM_CUDA_CHECK(cudaHostAlloc(&rec, sizeof(IndexErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(rec, 0, sizeof(IndexErrorRecord));
    void* dev = nullptr;
    TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&dev, rec, 0));
    s.host[device] = static_cast<IndexErrorRecord*>(rec);
    s.dev[device] = static_cast<IndexErrorRecord*>(dev);
  });
  return s.dev[device];
}

const char* index_op_name(int op) {
  switch (op) {
    case kIndexSelect:
      return "index_select";
    case kIndexAdd:
      return "index_add";
    case kGather:
      return "gather_elements";
    case kScatter:
      return "scatter_elements";
  }
  return "indexing";
}

// Any of the threads that meet a bad index may write the record; each field is one aligned store.
__device__ __noinline__ void report_index(IndexErrorRecord* rec, int op, long long index, long long extent) {
  volatile IndexErrorRecord* r = rec;
  r->op = op;
  r->index = index;
  r->extent = extent;
  __threadfence_system();
  r->flag = 1;
}

template <typename I>
__device__ __forceinline__ int64_t position(I v, int64_t n, IndexErrorRecord* rec, int op) {
  const int64_t p = v < 0 ? static_cast<int64_t>(v) + n : static_cast<int64_t>(v);
  if (p < 0 || p >= n) {
    report_index(rec, op, static_cast<long long>(v), n);
    return -1;
  }
  return p;
}

template <typename F>
void dispatch_index(const Tensor& index, const char* op, F&& f) {
  switch (index.dtype()) {
    case DType::i32: return f(static_cast<const int32_t*>(index.data_ptr()));
    case DType::i64: return f(static_cast<const int64_t*>(index.data_ptr()));
    default: TANDEM_CHECK(false, op, ": indices must be i32 or i64, got ", index.str());
  }
}

/// Calls f with an unsigned type as wide as `bytes` (1, 2, 4, 8 or 16).
template <typename F>
void dispatch_width(int bytes, F&& f) {
  switch (bytes) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
    case 16: return f(uint4{});
  }
  TANDEM_ASSERT(false, "element width ", bytes);
}

/// The widest unit (16 bytes down to the element) that divides a row of row_bytes and every address given:
/// rows of inner elements then move as whole units.
int unit_width(int64_t row_bytes, int elem, std::initializer_list<const void*> ptrs) {
  for (int w = 16; w > elem; w >>= 1) {
    bool ok = row_bytes % w == 0;
    for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % w == 0;
    if (ok) return w;
  }
  return elem;
}

// ---- selection and gathers (any element type, moved as units)
template <typename U, typename I>
__global__ void index_select_kernel(const U* __restrict__ x, const I* __restrict__ idx, int64_t n, int64_t m,
                                    int64_t inner, int64_t total, U* __restrict__ out, IndexErrorRecord* rec) {
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t r = e / inner, i = e - r * inner, o = r / m, j = r - o * m;
    const int64_t p = position(idx[j], n, rec, kIndexSelect);
    out[e] = p >= 0 ? x[(o * n + p) * inner + i] : U{};
  }
}

template <typename U, typename I>
__global__ void gather_elements_kernel(const U* __restrict__ x, const I* __restrict__ idx, int64_t n, int64_t m,
                                       int64_t inner, int64_t total, U* __restrict__ out, IndexErrorRecord* rec) {
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t i = e % inner, o = e / (m * inner);
    const int64_t p = position(idx[e], n, rec, kGather);
    out[e] = p >= 0 ? x[(o * n + p) * inner + i] : U{};
  }
}

// ---- index_add: index positions sorted once, then each destination sums its rows
template <typename I>
__global__ void index_keys_kernel(const I* __restrict__ idx, int64_t m, int64_t n, int32_t* __restrict__ keys,
                                  int32_t* __restrict__ vals, IndexErrorRecord* rec) {
  for (int64_t j = thread_index(); j < m; j += thread_count()) {
    const int64_t p = position(idx[j], n, rec, kIndexAdd);
    keys[j] = static_cast<int32_t>(p >= 0 ? p : n);  // bad ones sort last, past every destination
    vals[j] = static_cast<int32_t>(j);
  }
}

__global__ void segment_starts_kernel(const int32_t* __restrict__ keys, int64_t m, int64_t n,
                                      int32_t* __restrict__ starts) {
  for (int64_t d = thread_index(); d <= n; d += thread_count()) {
    int64_t lo = 0, hi = m;  // the first key >= d
    while (lo < hi) {
      const int64_t mid = (lo + hi) >> 1;
      if (keys[mid] < d)
        lo = mid + 1;
      else
        hi = mid;
    }
    starts[d] = static_cast<int32_t>(lo);
  }
}

template <typename T>
__global__ void index_add_kernel(const T* __restrict__ g, const int32_t* __restrict__ rows,
                                 const int32_t* __restrict__ starts, int64_t n, int64_t m, int64_t inner,
                                 int64_t total, T* __restrict__ dx) {
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t r = e / inner, i = e - r * inner, o = r / n, d = r - o * n;
    float acc = 0.f;
    for (int32_t q = starts[d], end = starts[d + 1]; q < end; ++q) acc += to_float(g[(o * m + rows[q]) * inner + i]);
    dx[e] = from_float<T>(acc);
  }
}

// ---- scatter_elements: (column, destination) keys sorted stably, each run of equal keys applied in order
template <typename I>
__global__ void scatter_keys_kernel(const I* __restrict__ idx, int64_t n, int64_t m, int64_t inner, int64_t total,
                                    unsigned long long* __restrict__ keys, long long* __restrict__ vals,
                                    IndexErrorRecord* rec) {
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t i = e % inner, o = e / (m * inner);
    int64_t p = position(idx[e], n, rec, kScatter);
    if (p < 0) p = n;  // a bad index gets a key of its own, skipped below
    keys[e] = static_cast<unsigned long long>((o * inner + i) * (n + 1) + p);
    vals[e] = e;
  }
}

template <typename T, bool kAccumulate>
__global__ void scatter_runs_kernel(const T* __restrict__ src, const unsigned long long* __restrict__ keys,
                                    const long long* __restrict__ vals, int64_t n, int64_t inner, int64_t total,
                                    T* __restrict__ dst) {
  for (int64_t q = thread_index(); q < total; q += thread_count()) {
    const unsigned long long key = keys[q];
    if (q > 0 && keys[q - 1] == key) continue;  // not the first of its run
    const int64_t p = static_cast<int64_t>(key % static_cast<unsigned long long>(n + 1));
    if (p == n) continue;
    const int64_t col = static_cast<int64_t>(key / static_cast<unsigned long long>(n + 1));
    const int64_t o = col / inner, i = col - o * inner, at = (o * n + p) * inner + i;
    int64_t end = q + 1;
    while (end < total && keys[end] == key) ++end;
    if constexpr (kAccumulate) {
      float acc = to_float(dst[at]);
      for (int64_t r = q; r < end; ++r) acc += to_float(src[vals[r]]);
      dst[at] = from_float<T>(acc);
    } else {
      dst[at] = src[vals[end - 1]];
    }
  }
}

// ---- writes through a strided view
constexpr int kMaxDims = 8;

struct Layout {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims];
};

// Drops extents of 1 and merges dimensions contiguous with the next.
Layout coalesced(const Tensor& t, const char* op) {
  Layout l{};
  int64_t shape[64], stride[64];
  int nd = 0;
  TANDEM_CHECK(t.dim() <= 64, op, ": tensors of more than 64 dimensions are not supported, got ", t.str());
  for (int64_t d = t.dim() - 1; d >= 0; --d) {  // innermost first
    const int64_t s = t.shape()[d];
    if (s == 1) continue;
    if (nd > 0 && t.strides()[d] == stride[nd - 1] * shape[nd - 1]) {
      shape[nd - 1] *= s;
      continue;
    }
    shape[nd] = s;
    stride[nd] = t.strides()[d];
    ++nd;
  }
  TANDEM_CHECK(nd <= kMaxDims, op, ": a view with ", nd, " dimensions that cannot be merged is not supported on CUDA (at most ",
               kMaxDims, ")");
  l.ndim = nd;
  for (int k = 0; k < nd; ++k) {
    l.shape[k] = shape[nd - 1 - k];
    l.stride[k] = stride[nd - 1 - k];
  }
  return l;
}

template <typename U>
__global__ void copy_into_strided_kernel(const U* __restrict__ src, U* __restrict__ dst, int64_t total, Layout l) {
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    int64_t rem = e, off = 0;
    for (int k = l.ndim - 1; k > 0; --k) {
      const int64_t q = rem / l.shape[k];
      off += (rem - q * l.shape[k]) * l.stride[k];
      rem = q;
    }
    if (l.ndim > 0) off += rem * l.stride[0];
    dst[off] = src[e];
  }
}

// ---- padding along one extent
__device__ __forceinline__ int64_t pad_source(int64_t p, int64_t n, int64_t before, bool reflect) {
  const int64_t t = p - before;
  if (reflect) return t < 0 ? -t : t >= n ? 2 * (n - 1) - t : t;
  return t < 0 ? 0 : t >= n ? n - 1 : t;
}

template <typename U>
__global__ void pad_axis_kernel(const U* __restrict__ x, int64_t n, int64_t len, int64_t inner, int64_t before,
                                bool reflect, int64_t total, U* __restrict__ out) {
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t r = e / inner, i = e - r * inner, o = r / len, p = r - o * len;
    out[e] = x[(o * n + pad_source(p, n, before, reflect)) * inner + i];
  }
}

template <typename T>
__global__ void pad_axis_backward_kernel(const T* __restrict__ g, int64_t n, int64_t inner, int64_t before,
                                         int64_t after, bool reflect, int64_t total, T* __restrict__ dx) {
  const int64_t len = before + n + after;
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t r = e / inner, i = e - r * inner, o = r / n, j = r - o * n;
    const T* go = g + o * len * inner + i;
    float acc = to_float(go[(j + before) * inner]);
    if (reflect) {
      if (j >= 1 && j <= before) acc += to_float(go[(before - j) * inner]);
      if (j >= n - 1 - after && j <= n - 2) acc += to_float(go[(before + 2 * (n - 1) - j) * inner]);
    } else {
      if (j == 0)
        for (int64_t p = 0; p < before; ++p) acc += to_float(go[p * inner]);
      if (j == n - 1)
        for (int64_t p = before + n; p < len; ++p) acc += to_float(go[p * inner]);
    }
    dx[e] = from_float<T>(acc);
  }
}

// ---- one-hot rows and nonzero positions
template <typename T, typename I>
__global__ void one_hot_kernel(const I* __restrict__ idx, int64_t depth, int64_t inner, int64_t total, float off,
                               float on, T* __restrict__ out) {
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t r = e / inner, i = e - r * inner, o = r / depth, d = r - o * depth;
    int64_t v = static_cast<int64_t>(idx[o * inner + i]);
    if (v < 0) v += depth;
    out[e] = from_float<T>(v == d ? on : off);
  }
}

// mask clears the sign bit of floating types: -0.0 counts as zero.
template <typename U>
__global__ void nonzero_flags_kernel(const U* __restrict__ x, U mask, int64_t total, uint8_t* __restrict__ flags) {
  for (int64_t e = thread_index(); e < total; e += thread_count()) flags[e] = (x[e] & mask) != 0;
}

__global__ void iota_kernel(long long* __restrict__ p, int64_t total) {
  for (int64_t e = thread_index(); e < total; e += thread_count()) p[e] = e;
}

__global__ void coordinates_kernel(const long long* __restrict__ flat, int64_t count, Layout shape,
                                   int64_t* __restrict__ out) {
  for (int64_t c = thread_index(); c < count; c += thread_count()) {
    int64_t rem = flat[c];
    for (int d = shape.ndim - 1; d >= 0; --d) {
      out[d * count + c] = rem % shape.shape[d];
      rem /= shape.shape[d];
    }
  }
}

int bits_for(uint64_t v) {
  int b = 1;
  while (b < 64 && (v >> b) != 0) ++b;
  return b;
}

}  // namespace

void CudaBackend::check_index_errors(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  IndexErrorRecord* rec = error_slots().host[device];
  if (!rec) return;
  volatile IndexErrorRecord* r = rec;
  if (!r->flag) return;
  const int op = r->op;
  const long long index = r->index, extent = r->extent;
  r->flag = 0;
  detail::throw_error(Error::Kind::Input,
                      detail::cat(index_op_name(op), ": index ", index, " is outside [", -extent, ", ", extent,
                                  ") (the extent indexed is ", extent, ") on cuda:", device,
                                  "; the element was read as 0 or not written"));
}

void CudaBackend::index_select(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                               Tensor& out) {
  const int64_t m = index.numel();
  TANDEM_ASSERT(x.numel() == outer * n * inner && out.numel() == outer * m * inner && x.dtype() == out.dtype(),
                "index_select extents");
  if (out.numel() == 0) return;
  DeviceState& st = state_for(out);
  IndexErrorRecord* rec = device_error_record(st.device);
  const int elem = static_cast<int>(dtype_size(x.dtype()));
  const int w = unit_width(inner * elem, elem, {x.data_ptr(), out.data_ptr()});
  const int64_t units = inner * elem / w, total = outer * m * units;
  dispatch_width(w, [&](auto tag) {
    using U = decltype(tag);
    dispatch_index(index, "index_select", [&](auto* idx) {
      using I = std::remove_const_t<std::remove_pointer_t<decltype(idx)>>;
      index_select_kernel<U, I><<<blocks_for(total), kBlock, 0, st.stream>>>(
          static_cast<const U*>(x.data_ptr()), idx, n, m, units, total, static_cast<U*>(out.data_ptr()), rec);
      TANDEM_CUDA_LAUNCH_CHECK("index_select_kernel");
    });
  });
}

void CudaBackend::index_add(const Tensor& g, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                            Tensor& dx) {
  const int64_t m = index.numel();
  TANDEM_ASSERT(g.numel() == outer * m * inner && dx.numel() == outer * n * inner && g.dtype() == dx.dtype(),
                "index_add extents");
  if (dx.numel() == 0) return;
  DeviceState& st = state_for(dx);
  kern::dispatch_float(g.dtype(), "index_add", [](auto) {});
  if (m == 0) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(dx.data_ptr(), 0, dx.nbytes(), st.stream));
    return;
  }
  TANDEM_CHECK(m < INT_MAX && n < INT_MAX, "index_add: ", m, " indices into an extent of ", n,
               " are more than the CUDA kernel takes (2^31 - 1)");
  IndexErrorRecord* rec = device_error_record(st.device);
  Allocator& alloc = allocator(st.device);
  const size_t im = static_cast<size_t>(m) * sizeof(int32_t);
  Scratch keys_in(alloc, im), keys_out(alloc, im), vals_in(alloc, im), vals_out(alloc, im),
      starts(alloc, static_cast<size_t>(n + 1) * sizeof(int32_t));
  dispatch_index(index, "index_add", [&](auto* idx) {
    using I = std::remove_const_t<std::remove_pointer_t<decltype(idx)>>;
    index_keys_kernel<I><<<blocks_for(m), kBlock, 0, st.stream>>>(idx, m, n, keys_in.as<int32_t>(),
                                                                  vals_in.as<int32_t>(), rec);
    TANDEM_CUDA_LAUNCH_CHECK("index_keys_kernel");
  });
  const int bits = bits_for(static_cast<uint64_t>(n));
  size_t temp_bytes = 0;
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<int32_t>(), keys_out.as<int32_t>(),
                                                    vals_in.as<int32_t>(), vals_out.as<int32_t>(), static_cast<int>(m),
                                                    0, bits, st.stream));
  Scratch temp(alloc, temp_bytes);
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in.as<int32_t>(),
                                                    keys_out.as<int32_t>(), vals_in.as<int32_t>(),
                                                    vals_out.as<int32_t>(), static_cast<int>(m), 0, bits, st.stream));
  segment_starts_kernel<<<blocks_for(n + 1), kBlock, 0, st.stream>>>(keys_out.as<int32_t>(), m, n,
                                                                      starts.as<int32_t>());
  TANDEM_CUDA_LAUNCH_CHECK("segment_starts_kernel");
  const int64_t total = dx.numel();
  kern::dispatch_float(g.dtype(), "index_add", [&](auto tag) {
    using T = decltype(tag);
    index_add_kernel<T><<<blocks_for(total), kBlock, 0, st.stream>>>(static_cast<const T*>(g.data_ptr()),
                                                                     vals_out.as<int32_t>(), starts.as<int32_t>(), n, m,
                                                                     inner, total, static_cast<T*>(dx.data_ptr()));
    TANDEM_CUDA_LAUNCH_CHECK("index_add_kernel");
  });
}

void CudaBackend::gather_elements(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                                  Tensor& out) {
  const int64_t total = index.numel(), m = outer * inner != 0 ? total / (outer * inner) : 0;
  TANDEM_ASSERT(x.numel() == outer * n * inner && out.numel() == total && x.dtype() == out.dtype(),
                "gather_elements extents");
  if (total == 0) return;
  DeviceState& st = state_for(out);
  IndexErrorRecord* rec = device_error_record(st.device);
  dispatch_width(static_cast<int>(dtype_size(x.dtype())), [&](auto tag) {
    using U = decltype(tag);
    dispatch_index(index, "gather_elements", [&](auto* idx) {
      using I = std::remove_const_t<std::remove_pointer_t<decltype(idx)>>;
      gather_elements_kernel<U, I><<<blocks_for(total), kBlock, 0, st.stream>>>(
          static_cast<const U*>(x.data_ptr()), idx, n, m, inner, total, static_cast<U*>(out.data_ptr()), rec);
      TANDEM_CUDA_LAUNCH_CHECK("gather_elements_kernel");
    });
  });
}

void CudaBackend::scatter_elements(const Tensor& src, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                                   bool accumulate, Tensor& dst) {
  const int64_t total = index.numel(), m = outer * inner != 0 ? total / (outer * inner) : 0;
  TANDEM_ASSERT(src.numel() == total && dst.numel() == outer * n * inner && src.dtype() == dst.dtype(),
                "scatter_elements extents");
  if (accumulate) kern::dispatch_float(src.dtype(), "scatter_elements", [](auto) {});
  if (total == 0) return;
  DeviceState& st = state_for(dst);
  IndexErrorRecord* rec = device_error_record(st.device);
  Allocator& alloc = allocator(st.device);
  const uint64_t key_range = static_cast<uint64_t>(outer * inner) * static_cast<uint64_t>(n + 1);
  TANDEM_CHECK(total < INT_MAX && key_range / static_cast<uint64_t>(n + 1) == static_cast<uint64_t>(outer * inner),
               "scatter_elements: ", total, " updates are more than the CUDA kernel takes (2^31 - 1)");
  const size_t kb = static_cast<size_t>(total) * 8;
  Scratch keys_in(alloc, kb), keys_out(alloc, kb), vals_in(alloc, kb), vals_out(alloc, kb);
  dispatch_index(index, "scatter_elements", [&](auto* idx) {
    using I = std::remove_const_t<std::remove_pointer_t<decltype(idx)>>;
    scatter_keys_kernel<I><<<blocks_for(total), kBlock, 0, st.stream>>>(
        idx, n, m, inner, total, keys_in.as<unsigned long long>(), vals_in.as<long long>(), rec);
    TANDEM_CUDA_LAUNCH_CHECK("scatter_keys_kernel");
  });
  const int bits = bits_for(key_range);
  size_t temp_bytes = 0;
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<unsigned long long>(),
                                                    keys_out.as<unsigned long long>(), vals_in.as<long long>(),
                                                    vals_out.as<long long>(), static_cast<int>(total), 0, bits,
                                                    st.stream));
  Scratch temp(alloc, temp_bytes);
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in.as<unsigned long long>(),
                                                    keys_out.as<unsigned long long>(), vals_in.as<long long>(),
                                                    vals_out.as<long long>(), static_cast<int>(total), 0, bits,
                                                    st.stream));
  auto launch = [&](auto tag, auto acc) {
    using T = decltype(tag);
    scatter_runs_kernel<T, decltype(acc)::value><<<blocks_for(total), kBlock, 0, st.stream>>>(
        static_cast<const T*>(src.data_ptr()), keys_out.as<unsigned long long>(), vals_out.as<long long>(), n, inner,
        total, static_cast<T*>(dst.data_ptr()));
    TANDEM_CUDA_LAUNCH_CHECK("scatter_runs_kernel");
  };
  if (accumulate) {
    kern::dispatch_float(src.dtype(), "scatter_elements", [&](auto tag) { launch(tag, std::true_type{}); });
    return;
  }
  // Written, never added: each width moves as one unsigned type.
  dispatch_width(static_cast<int>(dtype_size(src.dtype())), [&](auto tag) { launch(tag, std::false_type{}); });
}

void CudaBackend::copy_into_strided(const Tensor& src, Tensor& dst) {
  TANDEM_ASSERT(src.shape() == dst.shape() && src.dtype() == dst.dtype() && src.is_contiguous(),
                "copy_into_strided ", src.str(), " -> ", dst.str());
  const int64_t total = src.numel();
  if (total == 0) return;
  DeviceState& st = state_for(dst);
  const Layout l = coalesced(dst, "copy_into_strided");
  dispatch_width(static_cast<int>(dtype_size(src.dtype())), [&](auto tag) {
    using U = decltype(tag);
    copy_into_strided_kernel<U><<<blocks_for(total), kBlock, 0, st.stream>>>(
        static_cast<const U*>(src.data_ptr()), static_cast<U*>(dst.data_ptr()), total, l);
    TANDEM_CUDA_LAUNCH_CHECK("copy_into_strided_kernel");
  });
}

void CudaBackend::pad_axis(const Tensor& x, int64_t outer, int64_t n, int64_t inner, int64_t before, int64_t after,
                           bool reflect, Tensor& out) {
  const int64_t len = before + n + after;
  TANDEM_ASSERT(x.numel() == outer * n * inner && out.numel() == outer * len * inner && n > 0, "pad extents");
  if (out.numel() == 0) return;
  DeviceState& st = state_for(out);
  const int elem = static_cast<int>(dtype_size(x.dtype()));
  const int w = unit_width(inner * elem, elem, {x.data_ptr(), out.data_ptr()});
  const int64_t units = inner * elem / w, total = outer * len * units;
  dispatch_width(w, [&](auto tag) {
    using U = decltype(tag);
    pad_axis_kernel<U><<<blocks_for(total), kBlock, 0, st.stream>>>(static_cast<const U*>(x.data_ptr()), n, len, units,
                                                                    before, reflect, total,
                                                                    static_cast<U*>(out.data_ptr()));
    TANDEM_CUDA_LAUNCH_CHECK("pad_axis_kernel");
  });
}

void CudaBackend::pad_axis_backward(const Tensor& g, int64_t outer, int64_t n, int64_t inner, int64_t before,
                                    int64_t after, bool reflect, Tensor& dx) {
  TANDEM_ASSERT(g.numel() == outer * (before + n + after) * inner && dx.numel() == outer * n * inner && n > 0,
                "pad_backward extents");
  if (dx.numel() == 0) return;
  DeviceState& st = state_for(dx);
  const int64_t total = dx.numel();
  kern::dispatch_float(g.dtype(), "pad_backward", [&](auto tag) {
    using T = decltype(tag);
    pad_axis_backward_kernel<T><<<blocks_for(total), kBlock, 0, st.stream>>>(
        static_cast<const T*>(g.data_ptr()), n, inner, before, after, reflect, total, static_cast<T*>(dx.data_ptr()));
    TANDEM_CUDA_LAUNCH_CHECK("pad_axis_backward_kernel");
  });
}

void CudaBackend::one_hot(const Tensor& index, int64_t outer, int64_t depth, int64_t inner, double off, double on,
                          Tensor& out) {
  TANDEM_ASSERT(index.numel() == outer * inner && out.numel() == outer * depth * inner, "one_hot extents");
  if (out.numel() == 0) return;
  DeviceState& st = state_for(out);
  const int64_t total = out.numel();
  kern::dispatch_float(out.dtype(), "one_hot", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(index, "one_hot", [&](auto* idx) {
      using I = std::remove_const_t<std::remove_pointer_t<decltype(idx)>>;
      one_hot_kernel<T, I><<<blocks_for(total), kBlock, 0, st.stream>>>(
          idx, depth, inner, total, static_cast<float>(off), static_cast<float>(on), static_cast<T*>(out.data_ptr()));
      TANDEM_CUDA_LAUNCH_CHECK("one_hot_kernel");
    });
  });
}

Tensor CudaBackend::nonzero(const Tensor& x) {
  const int64_t total = x.numel(), nd = x.dim();
  DeviceState& st = state_for(x);
  Allocator& alloc = allocator(st.device);
  TANDEM_CHECK(total < INT_MAX, "nonzero: ", x.str(), " has more elements than the CUDA kernel takes (2^31 - 1)");
  TANDEM_CHECK(nd <= kMaxDims, "nonzero: ", x.str(), " has more than ", kMaxDims, " dimensions");
  if (total == 0) return Tensor::empty({nd, 0}, DType::i64, x.device());
  Scratch flags(alloc, static_cast<size_t>(total)), flat_in(alloc, static_cast<size_t>(total) * 8),
      flat_out(alloc, static_cast<size_t>(total) * 8), count(alloc, 8);
  auto flag = [&](auto tag, auto mask) {
    using U = decltype(tag);
    nonzero_flags_kernel<U><<<blocks_for(total), kBlock, 0, st.stream>>>(static_cast<const U*>(x.data_ptr()),
                                                                         static_cast<U>(mask), total,
                                                                         flags.as<uint8_t>());
    TANDEM_CUDA_LAUNCH_CHECK("nonzero_flags_kernel");
  };
  switch (x.dtype()) {
    case DType::f32: flag(uint32_t{}, 0x7fffffffu); break;
    case DType::f64: flag(uint64_t{}, 0x7fffffffffffffffull); break;
    case DType::f16:
    case DType::bf16: flag(uint16_t{}, 0x7fffu); break;
    case DType::i32: flag(uint32_t{}, 0xffffffffu); break;
    case DType::i64: flag(uint64_t{}, ~0ull); break;
    case DType::u8: flag(uint8_t{}, 0xffu); break;
  }
  iota_kernel<<<blocks_for(total), kBlock, 0, st.stream>>>(flat_in.as<long long>(), total);
  TANDEM_CUDA_LAUNCH_CHECK("iota_kernel");
  size_t temp_bytes = 0;
  TANDEM_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, temp_bytes, flat_in.as<long long>(), flags.as<uint8_t>(),
                                               flat_out.as<long long>(), count.as<long long>(),
                                               static_cast<int>(total), st.stream));
  Scratch temp(alloc, temp_bytes);
  TANDEM_CUDA_CHECK(cub::DeviceSelect::Flagged(temp.as<void>(), temp_bytes, flat_in.as<long long>(),
                                               flags.as<uint8_t>(), flat_out.as<long long>(), count.as<long long>(),
                                               static_cast<int>(total), st.stream));
  long long found = 0;
  copy_to_host(count.as<long long>(), &found, sizeof(found), st.device);  // the output's shape: waits
  Tensor out = Tensor::empty({nd, found}, DType::i64, x.device());
  if (found > 0 && nd > 0) {
    Layout shape{};
    shape.ndim = static_cast<int>(nd);
    for (int64_t d = 0; d < nd; ++d) shape.shape[d] = x.shape()[d];
    coordinates_kernel<<<blocks_for(found), kBlock, 0, st.stream>>>(flat_out.as<long long>(), found, shape,
                                                                     out.data<int64_t>());
    TANDEM_CUDA_LAUNCH_CHECK("coordinates_kernel");
  }
  return out;
}

}  // namespace tandem::backend
