// CPU backend: memory, copies, conversions, fills and random numbers.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"
#include "core/counter_rng.h"

namespace tandem::backend {

Backend* make_cpu_backend() { return new CpuBackend(); }

CpuBackend::CpuBackend()
    : allocator_(std::make_unique<CachingAllocator>(
          "CPU memory", [](size_t n) { return std::aligned_alloc(64, (n + 63) / 64 * 64); },
          [](void* p) { std::free(p); })) {}

void CpuBackend::copy_from_host(const void* src, void* dst, size_t nbytes, int) { std::memcpy(dst, src, nbytes); }
void CpuBackend::copy_to_host(const void* src, void* dst, size_t nbytes, int) { std::memcpy(dst, src, nbytes); }
void CpuBackend::copy_bytes(const void* src, void* dst, size_t nbytes, int) { std::memcpy(dst, src, nbytes); }

namespace {
template <typename T>
double load_as_double(const T& v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return static_cast<double>(static_cast<float>(v));
  else
    return static_cast<double>(v);
}
template <typename T>
T store_from_double(double v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// Converts one element; float <-> 16-bit formats go through float to round once.
template <typename S, typename D>
D convert(const S& v) {
  if constexpr (std::is_same_v<S, D>) {
    return v;
  } else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) {
    return D(static_cast<float>(load_as_double(v)));
  } else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
    return static_cast<D>(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}
}  // namespace

void CpuBackend::copy_strided(const Tensor& src, Tensor& dst) {
  const int64_t n = dst.numel();
  const int nd = static_cast<int>(src.dim());
  const Shape& shape = src.shape();
  const Shape& st = src.strides();
  bool contiguous = src.is_contiguous();
  dispatch_all(src.dtype(), [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch_all(dst.dtype(), [&](auto d_tag) {
      using D = decltype(d_tag);
      const S* s = static_cast<const S*>(src.data_ptr());
      D* d = static_cast<D*>(dst.data_ptr());
      if (contiguous) {
        cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) d[i] = convert<S, D>(s[i]);
        });
        return;
      }
      cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          int64_t rem = i, off = 0;
          for (int k = nd - 1; k >= 0; --k) {
            off += (rem % shape[k]) * st[k];
            rem /= shape[k];
          }
          d[i] = convert<S, D>(s[off]);
        }
      });
    });
  });
}

void CpuBackend::fill(Tensor& t, double value) {
  const int64_t n = t.numel();
  dispatch_all(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = store_from_double<T>(value);
    T* p = static_cast<T*>(t.data_ptr());
    cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) p[i] = v;
    });
  });
}

void CpuBackend::gather_samples(const Tensor& images, const Tensor& labels, const Tensor& order, Tensor& cursor,
                                float divisor, Tensor& x, Tensor& y) {
  const int64_t n = x.size(0), sample = images.numel() / std::max<int64_t>(images.size(0), 1);
  int64_t& position = cursor.data<int64_t>()[0];
  const int64_t begin = position;
  TANDEM_CHECK(begin >= 0 && begin + n <= order.numel(), "gather_samples: samples [", begin, ", ", begin + n,
               ") of an order of ", order.numel());
  position += n;
  const uint8_t* src = images.data<uint8_t>();
  const int32_t* lab = labels.data<int32_t>();
  const int32_t* ord = order.data<int32_t>() + begin;
  float* dst = x.data<float>();
  int32_t* out = y.data<int32_t>();
  cpu::parallel_for(n, cpu::grain_for(sample), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t s = ord[i];
      out[i] = lab[s];
      for (int64_t j = 0; j < sample; ++j) dst[i * sample + j] = static_cast<float>(src[s * sample + j]) / divisor;
    }
  });
}

void CpuBackend::random_uniform(Tensor& t, uint64_t seed, uint64_t offset, double lo, double hi) {
  const int64_t n = t.numel();
  dispatch_float(t.dtype(), "random_uniform", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data_ptr());
    cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) p[i] = static_cast<T>(lo + (hi - lo) * rng::uniform(seed, offset + i));
    });
  });
}

void CpuBackend::random_normal(Tensor& t, uint64_t seed, uint64_t offset, double mean, double std) {
  const int64_t n = t.numel();
  dispatch_float(t.dtype(), "random_normal", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data_ptr());
    cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) p[i] = static_cast<T>(mean + std * rng::normal(seed, offset + i));
    });
  });
}

void CpuBackend::dropout_mask(Tensor& mask, uint64_t seed, uint64_t offset, double p) {
  const int64_t n = mask.numel();
  dispatch_float(mask.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    T* m = static_cast<T*>(mask.data_ptr());
    const T keep = static_cast<T>(1.0 / (1.0 - p));
    const float pf = static_cast<float>(p);
    cpu::parallel_for(n, cpu::grain_for(1), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) m[i] = rng::uniform_f(seed, offset + i) >= pf ? keep : T(0);
    });
  });
}

}  // namespace tandem::backend
