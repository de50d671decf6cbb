// CPU backend: the FP8 casts (core/fp8.h's codes), the maxima they are scaled by and the scale update.
// Their results are the reference the CUDA kernels are compared with, byte for byte.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_parallel.h"
#include "core/fp8.h"

namespace tandem::backend {

namespace {

// Calls f with a pointer to x's elements as their C++ type: f32, bf16 or f16.
template <typename F>
void with_source(const Tensor& x, const char* op, F&& f) {
  switch (x.dtype()) {
    case DType::f32: return f(static_cast<const float*>(x.data_ptr()));
    case DType::bf16: return f(static_cast<const BFloat16*>(x.data_ptr()));
    case DType::f16: return f(static_cast<const Half*>(x.data_ptr()));
    default: TANDEM_CHECK(false, op, ": ", x.str(), " is not f32, bf16 or f16");
  }
}

inline float load(float v) { return v; }
inline float load(BFloat16 v) { return static_cast<float>(v); }
inline float load(Half v) { return static_cast<float>(v); }

float one_value(const Tensor& t, const char* op, const char* what) {
  TANDEM_CHECK(t.dtype() == DType::f32 && t.numel() == 1, op, ": ", what, " must be one f32 value, got ", t.str());
  return *static_cast<const float*>(t.data_ptr());
}

void check_codes(const Tensor& q, int64_t n, const char* op) {
  TANDEM_CHECK(q.dtype() == DType::u8 && q.numel() == n, op, ": codes ", q.str(), " for ", n, " elements (u8)");
}

// amax[0] = max(amax[0], m) over their bits (amax holds a non-negative value or NaN), as CUDA's atomicMax.
void merge_amax(Tensor& amax, uint32_t m) {
  float* a = static_cast<float*>(amax.data_ptr());
  const uint32_t merged = std::max(fp8::float_to_bits(*a), m);
  *a = fp8::bits_to_float(merged);
}

// The maximum of abs_bits over x's elements, in parallel ranges.
template <typename S>
uint32_t max_abs_bits(const S* x, int64_t n) {
  std::atomic<uint32_t> best{0};
  cpu::parallel_for(n, cpu::kParallelElems, [&](int64_t lo, int64_t hi) {
    uint32_t m = 0;
    for (int64_t i = lo; i < hi; ++i) m = std::max(m, fp8::abs_bits(load(x[i])));
    uint32_t seen = best.load();
    while (m > seen && !best.compare_exchange_weak(seen, m)) {
    }
  });
  return best.load();
}

}  // namespace

void CpuBackend::fp8_amax(const Tensor& x, Tensor& amax) {
  one_value(amax, "fp8_amax", "amax");
  with_source(x, "fp8_amax", [&](auto* in) { merge_amax(amax, max_abs_bits(in, x.numel())); });
}

void CpuBackend::fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format fmt, Tensor& q, Tensor& amax) {
  const float s = one_value(scale, "fp8_quantize", "the scale");
  const int64_t n = x.numel();
  check_codes(q, n, "fp8_quantize");
  if (amax.defined()) one_value(amax, "fp8_quantize", "amax");
  const bool e4 = fmt == Fp8Format::e4m3;
  uint8_t* out = static_cast<uint8_t*>(q.data_ptr());
  with_source(x, "fp8_quantize", [&](auto* in) {
    cpu::parallel_for(n, cpu::kParallelElems, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = fp8::encode(load(in[i]) * s, e4, true);
    });
    if (amax.defined()) merge_amax(amax, max_abs_bits(in, n));
  });
}

void CpuBackend::fp8_quantize_transposed(const Tensor& x, const Tensor& scale, Fp8Format fmt, int64_t rows,
                                         int64_t cols, Tensor& q, Tensor& qt, Tensor& amax) {
  const float s = one_value(scale, "fp8_quantize_transposed", "the scale");
  TANDEM_CHECK(x.numel() == rows * cols, "fp8_quantize_transposed: ", x.str(), " is not [", rows, ", ", cols, "]");
  check_codes(qt, rows * cols, "fp8_quantize_transposed");
  if (q.defined()) check_codes(q, rows * cols, "fp8_quantize_transposed");
  if (amax.defined()) one_value(amax, "fp8_quantize_transposed", "amax");
  const bool e4 = fmt == Fp8Format::e4m3;
  uint8_t* out = q.defined() ? static_cast<uint8_t*>(q.data_ptr()) : nullptr;
  uint8_t* out_t = static_cast<uint8_t*>(qt.data_ptr());
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  with_source(x, "fp8_quantize_transposed", [&](auto* in) {
    // Tiles of 32 x 32: rows of x read, columns of qt written, in a range the caches hold.
    cpu::parallel_for(row_tiles, cpu::grain_for(kTile * std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t rt = lo; rt < hi; ++rt) {
        const int64_t r0 = rt * kTile, r1 = std::min(rows, r0 + kTile);
        for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
          const int64_t c1 = std::min(cols, c0 + kTile);
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t c = c0; c < c1; ++c) {
              const uint8_t code = fp8::encode(load(in[r * cols + c]) * s, e4, true);
              if (out) out[r * cols + c] = code;
              out_t[c * rows + r] = code;
            }
          }
        }
      }
    });
    if (amax.defined()) merge_amax(amax, max_abs_bits(in, rows * cols));
  });
}

void CpuBackend::fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format fmt, Tensor& y) {
  const float si = one_value(scale_inv, "fp8_dequantize", "scale_inv");
  const int64_t n = y.numel();
  check_codes(q, n, "fp8_dequantize");
  const bool e4 = fmt == Fp8Format::e4m3;
  const uint8_t* in = static_cast<const uint8_t*>(q.data_ptr());
  auto run = [&](auto* out) {
    using D = std::remove_pointer_t<decltype(out)>;
    cpu::parallel_for(n, cpu::kParallelElems, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float v = fp8::decode(in[i], e4) * si;
        if constexpr (std::is_same_v<D, float>) {
          out[i] = v;
        } else {
          out[i] = D(v);
        }
      }
    });
  };
  switch (y.dtype()) {
    case DType::f32: return run(static_cast<float*>(y.data_ptr()));
    case DType::bf16: return run(static_cast<BFloat16*>(y.data_ptr()));
    case DType::f16: return run(static_cast<Half*>(y.data_ptr()));
    default: TANDEM_CHECK(false, "fp8_dequantize: output ", y.str(), " is not f32, bf16 or f16");
  }
}

void CpuBackend::fp8_scale_update(Tensor& history, Tensor& scale, Tensor& scale_inv, float fp8_max,
                                  float margin_factor, bool use_history_max, Tensor& verdict) {
  TANDEM_CHECK(history.dtype() == DType::f32 && history.dim() == 2 && scale.dtype() == DType::f32 &&
                   scale_inv.dtype() == DType::f32 && scale.numel() == history.size(1) &&
                   scale_inv.numel() == history.size(1) && history.size(0) >= 1,
               "fp8_scale_update: history ", history.str(), ", scale ", scale.str(), ", scale_inv ", scale_inv.str());
  if (verdict.defined()) one_value(verdict, "fp8_scale_update", "the verdict");
  const int64_t rows = history.size(0), count = history.size(1);
  float* h = static_cast<float*>(history.data_ptr());
  float* s = static_cast<float*>(scale.data_ptr());
  float* si = static_cast<float*>(scale_inv.data_ptr());
  bool finite = true;
  for (int64_t i = 0; i < count; ++i)
    finite &= fp8::update_scale(h, rows, count, i, s, si, fp8_max, margin_factor, use_history_max);
  if (!finite && verdict.defined())
    *static_cast<float*>(verdict.data_ptr()) = std::numeric_limits<float>::quiet_NaN();
}

}  // namespace tandem::backend
