// CPU backend: dense matrix products, f32 ones of a transformer's sizes through tandem's own kernel
// (cpu_sgemm.h) with their epilogues fused, the others through OpenBLAS, split across the backend threads.
#include <cblas.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"
#include "backend/cpu/cpu_sgemm.h"
#include "backend/cpu/cpu_vec_math.h"

extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
}

namespace tandem::backend {

namespace {
/// Floating-point operations past which one product of a batch is split across the threads by itself.
constexpr double kParallelFlopsPerProduct = 6.4e7;
}  // namespace

namespace cpu {

void ensure_blas_serial() {
  // Cheap when already serial; tandem::set_num_threads may have raised it since the last kernel.
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

void check_blas_extent(int64_t v, const char* what) {
  TANDEM_CHECK(v <= INT_MAX, "matrix product: ", what, " of ", v, " exceeds the BLAS limit of ", INT_MAX,
               "; use smaller tensors or batches");
}

template <typename T>
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS rejects a zero leading dimension; the product is empty, so only beta acts
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  const CBLAS_TRANSPOSE ota = ta ? CblasTrans : CblasNoTrans, otb = tb ? CblasTrans : CblasNoTrans;
  const auto im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ota, otb, im, in, ik, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                c, static_cast<int>(ldc));
  else
    cblas_dgemm(CblasRowMajor, ota, otb, im, in, ik, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                c, static_cast<int>(ldc));
}

template <typename T>
void gemm_parallel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                   int64_t ldb, T beta, T* c, int64_t ldc) {
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  int parts = static_cast<int>(std::min<double>(max_threads(), flops / kParallelFlops));
  if (parts <= 1) {
    blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Split the longer side of c into blocks that are multiples of 16 (whole cache lines of c).
  const bool by_cols = n >= m;
  const int64_t len = by_cols ? n : m;
  int64_t chunk = (len + parts - 1) / parts;
  chunk = (chunk + 15) / 16 * 16;
  parts = static_cast<int>((len + chunk - 1) / chunk);
  parallel_tasks(parts, parts, [&](int64_t p, int) {
    const int64_t lo = p * chunk, cnt = std::min(len, lo + chunk) - lo;
    if (by_cols)
      blas_gemm(ta, tb, m, cnt, k, alpha, a, lda, tb ? b + lo * ldb : b + lo, ldb, beta, c + lo, ldc);
    else
      blas_gemm(ta, tb, cnt, n, k, alpha, ta ? a + lo : a + lo * lda, lda, b, ldb, beta, c + lo * ldc, ldc);
  });
}

template <typename T>
double dot(const T* x, const T* y, int64_t n) {
  // Blocks of kDotBlock summed in eight float lanes (dot_f32), the block sums in double, in block order:
  // the same value whatever the thread count.
  constexpr int64_t kDotBlock = 2048;
  const int64_t blocks = (n + kDotBlock - 1) / kDotBlock;
  std::vector<double> part(static_cast<size_t>(blocks));
  parallel_tasks(blocks, n >= 4 * kParallelElems ? max_threads() : 1, [&](int64_t bl, int) {
    const int64_t lo = bl * kDotBlock, len = std::min(n, lo + kDotBlock) - lo;
    if constexpr (std::is_same_v<T, float>) {
      part[static_cast<size_t>(bl)] = dot_f32(x + lo, y + lo, len);
    } else {
      double s = 0.0;
      for (int64_t i = 0; i < len; ++i) s += static_cast<double>(x[lo + i]) * static_cast<double>(y[lo + i]);
      part[static_cast<size_t>(bl)] = s;
    }
  });
  double total = 0.0;
  for (double v : part) total += v;
  return total;
}
template double dot<float>(const float*, const float*, int64_t);
template double dot<double>(const double*, const double*, int64_t);

int gemm_threads(int64_t m, int64_t n, int64_t k) {
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  return static_cast<int>(std::max(1.0, std::min<double>(max_threads(), flops / kParallelFlops)));
}

template void blas_gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                               int64_t, float, float*, int64_t);
template void blas_gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                                int64_t, double, double*, int64_t);
template void gemm_parallel<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                                   int64_t, float, float*, int64_t);
template void gemm_parallel<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                    const double*, int64_t, double, double*, int64_t);

}  // namespace cpu

void CpuBackend::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                      const Tensor& b, double beta, Tensor& c) {
  TANDEM_ASSERT(a.dtype() == c.dtype() && b.dtype() == c.dtype(), "gemm operands ", a.str(), ", ", b.str(), ", ",
                c.str());
  TANDEM_ASSERT(a.numel() == m * k && b.numel() == k * n && c.numel() == m * n, "gemm extents ", m, "x", n, "x", k,
                " for ", a.str(), ", ", b.str(), ", ", c.str());
  for (int64_t v : {m, n, k}) cpu::check_blas_extent(v, "an extent");
  const int64_t lda = std::max<int64_t>(1, trans_a ? m : k), ldb = std::max<int64_t>(1, trans_b ? k : n),
                ldc = std::max<int64_t>(1, n);
  if (m == 1 && n == 1 && k > 0) {  // a dot product (a gradient's squared norm): a reduction, not a tiled product
    dispatch_float(c.dtype(), "gemm", [&](auto tag) {
      using T = decltype(tag);
      T* pc = static_cast<T*>(c.data_ptr());
      const double d = cpu::dot<T>(static_cast<const T*>(a.data_ptr()), static_cast<const T*>(b.data_ptr()), k);
      *pc = static_cast<T>(alpha * d + (beta == 0.0 ? 0.0 : beta * static_cast<double>(*pc)));
    });
    return;
  }
  if (c.dtype() == DType::f32 && cpu::sgemm_preferred(trans_a, m, n, k)) {
    cpu::sgemm(trans_a, trans_b, m, n, k, static_cast<float>(alpha), a.data<float>(), lda, b.data<float>(), ldb,
               static_cast<float>(beta), c.data<float>(), ldc, {}, cpu::gemm_threads(m, n, k));
    return;
  }
  cpu::ensure_blas_serial();
  dispatch_float(c.dtype(), "gemm", [&](auto tag) {
    using T = decltype(tag);
    cpu::gemm_parallel<T>(trans_a, trans_b, m, n, k, static_cast<T>(alpha), static_cast<const T*>(a.data_ptr()), lda,
                          static_cast<const T*>(b.data_ptr()), ldb, static_cast<T>(beta), static_cast<T*>(c.data_ptr()),
                          ldc);
  });
}

// Batched products: large matrices are split across the threads one product at a time; small ones run
// whole products on each thread.
void CpuBackend::gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k,
                              double alpha, const Tensor& a, int64_t stride_a, const Tensor& b, int64_t stride_b,
                              double beta, Tensor& c, int64_t stride_c) {
  TANDEM_ASSERT(a.dtype() == c.dtype() && b.dtype() == c.dtype(), "gemm_batched operands ", a.str(), ", ", b.str(),
                ", ", c.str());
  TANDEM_ASSERT(batch == 0 || (a.numel() >= (batch - 1) * stride_a + m * k && b.numel() >= (batch - 1) * stride_b + k * n &&
                               c.numel() >= (batch - 1) * stride_c + m * n),
                "gemm_batched extents ", batch, "x", m, "x", n, "x", k, " for ", a.str(), ", ", b.str(), ", ", c.str());
  if (batch == 0 || m == 0 || n == 0) return;
  for (int64_t v : {m, n, k}) cpu::check_blas_extent(v, "an extent");
  const int64_t lda = std::max<int64_t>(1, trans_a ? m : k), ldb = std::max<int64_t>(1, trans_b ? k : n),
                ldc = std::max<int64_t>(1, n);
  cpu::ensure_blas_serial();
  dispatch_float(c.dtype(), "gemm_batched", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* pc = static_cast<T*>(c.data_ptr());
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    if (batch == 1 || flops >= kParallelFlopsPerProduct) {
      for (int64_t i = 0; i < batch; ++i)
        cpu::gemm_parallel<T>(trans_a, trans_b, m, n, k, static_cast<T>(alpha), pa + i * stride_a, lda,
                              pb + i * stride_b, ldb, static_cast<T>(beta), pc + i * stride_c, ldc);
      return;
    }
    const int threads = static_cast<int>(std::min<double>(
        cpu::max_threads(), std::max(1.0, flops * static_cast<double>(batch) / cpu::kParallelFlops)));
    const bool own = std::is_same_v<T, float> && cpu::sgemm_preferred(trans_a, m, n, k);
    cpu::parallel_tasks(batch, threads, [&](int64_t i, int) {
      if constexpr (std::is_same_v<T, float>) {
        if (own) {
          cpu::sgemm(trans_a, trans_b, m, n, k, static_cast<float>(alpha), pa + i * stride_a, lda, pb + i * stride_b,
                     ldb, static_cast<float>(beta), pc + i * stride_c, ldc);
          return;
        }
      }
      cpu::blas_gemm<T>(trans_a, trans_b, m, n, k, static_cast<T>(alpha), pa + i * stride_a, lda, pb + i * stride_b,
                        ldb, static_cast<T>(beta), pc + i * stride_c, ldc);
    });
  });
}

// f32 products of the own kernel's sizes run with their epilogue fused (each tile of C finished while in the
// cache); the rest take the default composition.
void CpuBackend::gemm_fused(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const Tensor& a,
                            const Tensor& b, double beta, Tensor& c, const GemmFusion& f) {
  // A untransposed may be rows a.stride(0) apart (padded rows): read in place.
  const bool a_rows = a.dim() == 2 && a.size(0) == m && a.size(1) == k && a.strides()[1] == 1;
  const bool fits = a.dtype() == DType::f32 && b.dtype() == DType::f32 && c.dtype() == DType::f32 &&
                    b.is_contiguous() && c.is_contiguous() && (a.is_contiguous() || (!trans_a && a_rows)) &&
                    (!f.bias.defined() || (f.bias.dtype() == DType::f32 && f.bias.is_contiguous())) &&
                    (!f.aux.defined() || (f.aux.dtype() == DType::f32 && f.aux.is_contiguous())) &&
                    cpu::sgemm_preferred(trans_a, m, n, k);
  if (!fits) {
    Backend::gemm_fused(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, f);
    return;
  }
  TANDEM_ASSERT(!f.a_row_sums.defined() || trans_a, "gemm_fused: row sums of op(A) need trans_a");
  TANDEM_ASSERT(!f.addend.defined() || (beta == 0.0 && f.addend.dtype() == c.dtype() && f.addend.numel() == m * n &&
                                        f.addend.is_contiguous() && !f.addend.is_same(c)),
                "gemm_fused: an addend ", f.addend.defined() ? f.addend.str() : "", " for C ", c.str());
  TANDEM_ASSERT(!f.c_col_sums.defined() || f.epilogue == GemmEpilogue::DGelu, "gemm_fused: column sums need DGelu");
  TANDEM_ASSERT(c.numel() == m * n && (!f.aux.defined() || f.aux.numel() == m * n), "gemm_fused: C ", c.str(), " for ",
                m, "x", n);
  for (int64_t v : {m, n, k}) cpu::check_blas_extent(v, "an extent");
  cpu::SgemmEpilogue e;
  switch (f.epilogue) {
    case GemmEpilogue::None: break;
    case GemmEpilogue::Bias: e.kind = cpu::SgemmEpilogue::Kind::Bias; break;
    case GemmEpilogue::BiasGelu: e.kind = cpu::SgemmEpilogue::Kind::BiasGelu; break;
    case GemmEpilogue::DGelu: e.kind = cpu::SgemmEpilogue::Kind::DGelu; break;
  }
  if (f.bias.defined()) e.bias = f.bias.data<float>();
  if (f.aux.defined()) {
    e.aux = static_cast<float*>(f.aux.data_ptr());
    e.ld_aux = n;
  }
  if (f.addend.defined()) {
    e.addend = f.addend.data<float>();
    e.ld_addend = n;
  }
  const int64_t lda = trans_a ? std::max<int64_t>(1, m) : (a.is_contiguous() ? std::max<int64_t>(1, k) : a.strides()[0]),
                ldb = std::max<int64_t>(1, trans_b ? k : n);
  cpu::sgemm(trans_a, trans_b, m, n, k, static_cast<float>(alpha), a.data<float>(), lda, b.data<float>(), ldb,
             static_cast<float>(beta), c.data<float>(), std::max<int64_t>(1, n), e, cpu::gemm_threads(m, n, k));
  if (f.c_col_sums.defined()) {
    Tensor sums = f.c_col_sums;
    bias_grad(c, m, n, 1, sums);
  }
  if (f.a_row_sums.defined()) {
    Tensor sums = f.a_row_sums;
    bias_grad(a, k, m, 1, sums);  // A is [k, m]: its column sums
  }
}

}  // namespace tandem::backend
