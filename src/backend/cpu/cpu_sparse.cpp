// CPU backend: gradient compression kernels of the distributed optimizer.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

namespace {
int32_t float_bits(float v) {
  int32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
float bits_float(int32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}
void check_f32(const Tensor& t, const char* op) {
  TANDEM_CHECK(t.dtype() == DType::f32, op, ": gradients must be f32, got ", t.str());
}
}  // namespace

void CpuBackend::scale_cast(const Tensor& src, Tensor& dst, double scale, double clip) {
  const int64_t n = src.numel();
  const float s = static_cast<float>(scale), c = static_cast<float>(clip);
  dispatch_all(src.dtype(), [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch_all(dst.dtype(), [&](auto d_tag) {
      using D = decltype(d_tag);
      if constexpr (!(std::is_same_v<S, float> || std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) ||
                    !(std::is_same_v<D, float> || std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>)) {
        TANDEM_CHECK(false, "scale_cast: ", dtype_name(src.dtype()), " -> ", dtype_name(dst.dtype()),
                     " is not supported (f32, f16, bf16)");
      } else {
        const S* in = static_cast<const S*>(src.data_ptr());
        D* out = static_cast<D*>(dst.data_ptr());
        cpu::parallel_for(n, cpu::kParallelElems, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) {
            float v = static_cast<float>(in[i]) * s;
            if (c > 0.0f) v = std::min(std::max(v, -c), c);
            out[i] = D(v);
          }
        });
      }
    });
  });
}

void CpuBackend::sparse_topk(const Tensor& g, int64_t k, Tensor& pairs) {
  check_f32(g, "sparse_topk");
  const int64_t n = g.numel();
  TANDEM_ASSERT(k >= 1 && k <= n && pairs.numel() == 2 * k);
  const float* v = g.data<float>();
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  // Exact magnitudes: every |g| is compared as a float, so values below 1 are ranked correctly.
  std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(),
                   [v](int32_t a, int32_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
  int32_t* p = pairs.data<int32_t>();
  for (int64_t i = 0; i < k; ++i) {
    p[2 * i] = idx[static_cast<size_t>(i)];
    p[2 * i + 1] = float_bits(v[idx[static_cast<size_t>(i)]]);
  }
}

void CpuBackend::sparse_threshold(const Tensor& g, double threshold, Tensor& pairs, Tensor& count) {
  check_f32(g, "sparse_threshold");
  const int64_t n = g.numel();
  const float* v = g.data<float>();
  const float t = static_cast<float>(threshold);
  int32_t* p = pairs.data<int32_t>();
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::fabs(v[i]) >= t) {
      p[2 * c] = static_cast<int32_t>(i);
      p[2 * c + 1] = float_bits(v[i]);
      ++c;
    }
  count.data<int64_t>()[0] = c;
}

void CpuBackend::sparse_accumulate(Tensor& dense, const Tensor& pairs, int64_t n, double scale) {
  check_f32(dense, "sparse_accumulate");
  float* d = dense.data<float>();
  const int32_t* p = pairs.data<int32_t>();
  const float s = static_cast<float>(scale);
  const int64_t size = dense.numel();
  for (int64_t i = 0; i < n; ++i) {
    int32_t j = p[2 * i];
    TANDEM_ASSERT(j >= 0 && j < size, "sparse index ", j, " outside a bucket of ", size);
    d[j] += s * bits_float(p[2 * i + 1]);
  }
}

void CpuBackend::sparse_zero(Tensor& dense, const Tensor& pairs, int64_t n) {
  check_f32(dense, "sparse_zero");
  float* d = dense.data<float>();
  const int32_t* p = pairs.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) d[p[2 * i]] = 0.0f;
}

}  // namespace tandem::backend
