// CUDA backend: products with their epilogue fused through cuBLASLt — a linear layer's bias, the bias and
// GELU of a transformer's MLP (its input kept for the backward), the GELU's gradient — so that none of them
// costs a pass over the activations of its own; a residual added as the product's C operand; the bias gradient
// of the GELU's layer beside the GELU's gradient; weight gradients written in f32 from 16-bit operands. One
// plan (descriptors and algorithm) is kept per shape, type, epilogue and operand alignment; cases cuBLASLt does
// not take go to the composed default. The algorithm is the fastest of cuBLASLt's heuristic candidates, timed
// once at the plan's first use outside a recording (TANDEM_GEMM_TUNE=0: the heuristic's first choice). Also
// the FP8 products (fp8_gemm): e4m3 / e5m2 operands with per-tensor scales read on the device, f32 sums, the
// heuristic's first algorithm.
#include <cublasLt.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "tandem/precision.h"

namespace tandem::backend {

namespace {

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }


struct Plan {
  bool usable = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

}  // namespace

bool gemm_tuning_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("TANDEM_GEMM_TUNE");
    return !(e && e[0] == '0');
  }();
  return on && !deterministic_algorithms();  // a timed choice may differ from one run to the next
}

// How many of cuBLASLt's heuristic candidates the tuning times (TANDEM_GEMM_CANDIDATES, 1-64; 8 by default).
int gemm_candidates() {
  static const int count = [] {
    const char* e = std::getenv("TANDEM_GEMM_CANDIDATES");
    if (!e || !*e) return 8;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    TANDEM_CHECK(end && *end == '\0' && v >= 1 && v <= 64, "TANDEM_GEMM_CANDIDATES=", e,
                 ": expected a count from 1 to 64");
    return static_cast<int>(v);
  }();
  return count;
}

DGeluFusion dgelu_fusion() {
  static const DGeluFusion mode = [] {
    const char* e = std::getenv("TANDEM_DGELU_EPILOGUE");
    const std::string v = e ? e : "";
    if (v.empty() || v == "dgelu") return DGeluFusion::Derivative;
    if (v == "bgrad") return DGeluFusion::DerivativeAndSums;
    if (v == "none") return DGeluFusion::None;
    TANDEM_CHECK(false, "TANDEM_DGELU_EPILOGUE=", v, ": expected dgelu (the default), bgrad or none");
    return DGeluFusion::Derivative;
  }();
  return mode;
}

class LtCache {
 public:
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, int, int, int, bool, int64_t>;
  cublasLtHandle_t handle = nullptr;
  std::map<Key, Plan> plans;
  // FP8 products: m, n, k, the operands' formats, C's type.
  using Fp8Key = std::tuple<int64_t, int64_t, int64_t, int, int, int>;
  std::map<Fp8Key, Plan> fp8_plans;
  LtCache() { TANDEM_CUBLAS_CHECK(cublasLtCreate(&handle)); }
  static void destroy(Plan& p) {
    if (p.desc) (void)cublasLtMatmulDescDestroy(p.desc);
    for (cublasLtMatrixLayout_t l : {p.la, p.lb, p.lc})
      if (l) (void)cublasLtMatrixLayoutDestroy(l);
  }
  ~LtCache() {
    // At exit the runtime may be gone: errors are ignored.
    for (auto& [key, p] : plans) destroy(p);
    for (auto& [key, p] : fp8_plans) destroy(p);
    if (handle) (void)cublasLtDestroy(handle);
  }
};

bool CudaBackend::lt_matmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                            const Tensor& a, const Tensor& b, double beta, Tensor& c, const GemmFusion& f) {
  const bool half_inputs = (a.dtype() == DType::bf16 || a.dtype() == DType::f16) && b.dtype() == a.dtype();
  const bool f32_out = c.dtype() == DType::f32;
  const bool add = f.addend.defined();
  if (!half_inputs || !(c.dtype() == a.dtype() || f32_out) || m == 0 || n == 0 || k == 0 ||
      (f.epilogue != GemmEpilogue::None && f32_out) || (add && (f32_out || beta != 0.0)) ||
      (f.a_row_sums.defined() && !trans_a) || (f.c_col_sums.defined() && f.epilogue != GemmEpilogue::DGelu))
    return false;
  // A's rows: packed, or (A untransposed) a.strides()[0] apart, 16-byte aligned (padded rows).
  int64_t lda = trans_a ? m : k;
  if (!a.is_contiguous()) {
    if (trans_a || a.dim() != 2 || a.strides()[1] != 1 || a.strides()[0] < k ||
        (a.strides()[0] * static_cast<int64_t>(dtype_size(a.dtype()))) % 16 != 0)
      return false;
    lda = a.strides()[0];
  }
  DeviceState& s = state_for(c);
  const bool bgrad = f.c_col_sums.defined();
  const Tensor vec = bgrad ? f.c_col_sums
                     : f.epilogue == GemmEpilogue::Bias || f.epilogue == GemmEpilogue::BiasGelu ? f.bias : Tensor();
  const bool has_aux = f.epilogue == GemmEpilogue::BiasGelu || f.epilogue == GemmEpilogue::DGelu;
  cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
  switch (f.epilogue) {
    case GemmEpilogue::None: break;
    case GemmEpilogue::Bias: ep = CUBLASLT_EPILOGUE_BIAS; break;
    case GemmEpilogue::BiasGelu: ep = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
    case GemmEpilogue::DGelu: ep = bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU; break;
  }
  const void* c_in = add ? f.addend.data_ptr() : c.data_ptr();
  const int align = (aligned16(a.data_ptr()) ? 1 : 0) | (aligned16(b.data_ptr()) ? 2 : 0) |
                    (aligned16(c.data_ptr()) ? 4 : 0) | (vec.defined() && aligned16(vec.data_ptr()) ? 8 : 0) |
                    (has_aux && aligned16(f.aux.data_ptr()) ? 16 : 0) | (aligned16(c_in) ? 32 : 0);
  const LtCache::Key key{m, n, k, trans_a, trans_b, static_cast<int>(a.dtype()), static_cast<int>(c.dtype()),
                         static_cast<int>(ep), vec.defined() ? static_cast<int>(vec.dtype()) : -1, align,
                         add || beta != 0.0, lda};
  const float al = static_cast<float>(alpha), be = add ? 1.0f : static_cast<float>(beta);
  std::unique_lock<std::mutex> lock(s.cublas_mu);
  if (!s.lt) s.lt = std::make_shared<LtCache>();
  LtCache& cache = *s.lt;
  // This call's pointers (a plan may have been made for other tensors of the same shape).
  auto point = [&](Plan& p) {
    if (vec.defined()) {
      const void* vp = vec.data_ptr();
      TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vp, sizeof(vp)));
    }
    if (has_aux) {
      const void* xp = f.aux.data_ptr();
      TANDEM_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &xp, sizeof(xp)));
    }
  };
  auto run = [&](Plan& p, const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(cache.handle, p.desc, &al, b.data_ptr(), p.la, a.data_ptr(), p.lb, &be, c_in, p.lc,
                          c.data_ptr(), p.lc, &algo, s.cublas_workspace, s.cublas_workspace_bytes, s.stream);
  };
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) {
    // Column-major cuBLASLt computes the row-major C = op(A) op(B) as C^T = op(B)^T op(A)^T: its A is our B
    // and its B our A, each matrix read as its own transpose; C^T's rows are C's columns, so the bias (one
    // per column of C) is cuBLASLt's per-row bias, and the bias gradient its sum over C^T's columns.
    Plan p;
    const cudaDataType_t ab = lt_type(a.dtype()), ct = lt_type(c.dtype());
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_lt_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_lt_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)));
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)));
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    if (vec.defined()) {
      const int32_t vt = lt_type(vec.dtype());
      TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vt, sizeof(vt)));
    }
    if (has_aux) {
      const int64_t ld = n;
      TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    }
    point(p);
    // Stored shapes, column-major: our B is [k, n] row-major ([n, k] when transposed), our A [m, k] ([k, m]),
    // its rows lda apart.
    const uint64_t la_rows = trans_b ? k : n, la_cols = trans_b ? n : k, lb_rows = trans_a ? m : k,
                   lb_cols = trans_a ? k : m;
    TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, ab, la_rows, la_cols, static_cast<int64_t>(la_rows)));
    TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, ab, lb_rows, lb_cols, lda));
    TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, ct, n, m, n));
    cublasLtMatmulPreference_t pref = nullptr;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = s.cublas_workspace_bytes;
    TANDEM_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    constexpr int kMaxCandidates = 64;
    const int candidates = gemm_candidates();
    cublasLtMatmulHeuristicResult_t results[kMaxCandidates]{};
    int found = 0;
    // In place (C read and written, beta != 0) a trial would change C: the first choice is taken untimed.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    TANDEM_CUDA_CHECK(cudaStreamIsCapturing(s.stream, &capturing));
    const bool tune = gemm_tuning_enabled() && capturing == cudaStreamCaptureStatusNone && (add || beta == 0.0);
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cache.handle, p.desc, p.la, p.lb, p.lc, p.lc, pref,
                                                             tune ? candidates : 1, results, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    p.usable = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p.usable) p.algo = results[0].algo;
    if (p.usable && tune && found > 1) {
      // Each candidate runs twice untimed, then three times between events; a candidate the device refuses
      // at run time is passed over.
      cudaEvent_t e0 = nullptr, e1 = nullptr;
      TANDEM_CUDA_CHECK(cudaEventCreate(&e0));
      TANDEM_CUDA_CHECK(cudaEventCreate(&e1));
      float best = -1.0f;
      for (int i = 0; i < found; ++i) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
        bool ok = true;
        for (int r = 0; r < 2 && ok; ++r) ok = run(p, results[i].algo) == CUBLAS_STATUS_SUCCESS;
        if (!ok) continue;
        TANDEM_CUDA_CHECK(cudaEventRecord(e0, s.stream));
        for (int r = 0; r < 3 && ok; ++r) ok = run(p, results[i].algo) == CUBLAS_STATUS_SUCCESS;
        TANDEM_CUDA_CHECK(cudaEventRecord(e1, s.stream));
        TANDEM_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (ok && (best < 0.0f || ms < best)) {
          best = ms;
          p.algo = results[i].algo;
        }
      }
      (void)cudaEventDestroy(e0);
      (void)cudaEventDestroy(e1);
      p.usable = best >= 0.0f;
    }
    it = cache.plans.emplace(key, p).first;
  }
  Plan& p = it->second;
  if (!p.usable) return false;
  point(p);
  const cublasStatus_t st = run(p, p.algo);
  if (st == CUBLAS_STATUS_SUCCESS) {
    lock.unlock();
    if (f.a_row_sums.defined()) {
      Tensor sums = f.a_row_sums;
      bias_grad(a, k, m, 1, sums);  // A is [k, m]: its column sums
    }
    return true;
  }
  TANDEM_CHECK(st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE,
               "cublasLtMatmul failed: ", cublasGetStatusName(st), " (", cublasGetStatusString(st), ")");
  p.usable = false;  // refused at run time: composed from now on
  return false;
}

bool CudaBackend::lt_fp8_matmul(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b,
                                Fp8Format fb, const Tensor& b_scale_inv, int64_t m, int64_t n, int64_t k, Tensor& c) {
  DeviceState& s = state_for(c);
  // cuBLASLt's FP8 products: Ada and Hopper on (compute capability 8.9), not e5m2 by e5m2, both operands' rows of
  // k codes 16-byte aligned, C's rows too (n a multiple of 16 covers f32 and bf16).
  const bool e5_by_e5 = fa == Fp8Format::e5m2 && fb == Fp8Format::e5m2;
  if (s.compute_capability < 89 || e5_by_e5 || m == 0 || n == 0 || k == 0 || k % 16 != 0 || n % 16 != 0 ||
      !(c.dtype() == DType::f32 || c.dtype() == DType::bf16) || a.dtype() != DType::u8 || b.dtype() != DType::u8 ||
      !aligned16(a.data_ptr()) || !aligned16(b.data_ptr()) || !aligned16(c.data_ptr()))
    return false;
  for (const Tensor* t : {&a_scale_inv, &b_scale_inv})
    TANDEM_CHECK(t->dtype() == DType::f32 && t->numel() == 1 && t->device() == c.device(),
                 "fp8_gemm: a scale_inv is one f32 value on the product's device, got ", t->str());
  const auto fp8_type = [](Fp8Format f) { return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; };
  const LtCache::Fp8Key key{m, n, k, static_cast<int>(fa), static_cast<int>(fb), static_cast<int>(c.dtype())};
  std::unique_lock<std::mutex> lock(s.cublas_mu);
  if (!s.lt) s.lt = std::make_shared<LtCache>();
  LtCache& cache = *s.lt;
  // cuBLASLt's operands as for lt_matmul (column-major C^T = B A^T): its A is our b [n, k] read transposed, its B
  // our a [m, k] read as it is: the "TN" layout FP8 products need. Its A's scale is therefore b's.
  auto point = [&](Plan& p) {
    const void* sa = b_scale_inv.data_ptr();
    const void* sb = a_scale_inv.data_ptr();
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  };
  auto it = cache.fp8_plans.find(key);
  if (it == cache.fp8_plans.end()) {
    Plan p;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    point(p);
    const auto uk = static_cast<uint64_t>(k), un = static_cast<uint64_t>(n), um = static_cast<uint64_t>(m);
    TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, fp8_type(fb), uk, un, k));
    TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, fp8_type(fa), uk, um, k));
    TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, lt_type(c.dtype()), un, um, n));
    cublasLtMatmulPreference_t pref = nullptr;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = s.cublas_workspace_bytes;
    TANDEM_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(cache.handle, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &result, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    p.usable = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p.usable) p.algo = result.algo;
    it = cache.fp8_plans.emplace(key, p).first;
  }
  Plan& p = it->second;
  if (!p.usable) return false;
  point(p);
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(cache.handle, p.desc, &one, b.data_ptr(), p.la, a.data_ptr(), p.lb, &zero,
                                           c.data_ptr(), p.lc, c.data_ptr(), p.lc, &p.algo, s.cublas_workspace,
                                           s.cublas_workspace_bytes, s.stream);
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  TANDEM_CHECK(st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE,
               "cublasLtMatmul (FP8) failed: ", cublasGetStatusName(st), " (", cublasGetStatusString(st), ")");
  p.usable = false;  // refused at run time: emulated from now on
  return false;
}

void CudaBackend::gemm_fused(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                             const Tensor& a, const Tensor& b, double beta, Tensor& c, const GemmFusion& f) {
  // cuBLASLt here: 16-bit operands with an epilogue or a residual to fuse, or C in f32 (a weight gradient); a
  // plain 16-bit product is cuBLAS's (gemm). The sums of op(A) are taken by the backend's own reduction after
  // the product: cuBLASLt's BGRADB runs as a kernel of its own, slower than that one (measured on an H200,
  // GPT-2's layers).
  const bool plain = f.epilogue == GemmEpilogue::None && !f.addend.defined() && c.dtype() != DType::f32;
  const DGeluFusion dg = f.epilogue == GemmEpilogue::DGelu ? dgelu_fusion() : DGeluFusion::DerivativeAndSums;
  if (dg == DGeluFusion::None) return Backend::gemm_fused(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, f);
  const bool try_sums = dg == DGeluFusion::DerivativeAndSums || !f.c_col_sums.defined();
  if (!plain && try_sums && lt_matmul(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, f)) return;
  if (!plain && f.c_col_sums.defined()) {  // the GELU's derivative fused without the column sums, then those
    GemmFusion g = f;
    g.c_col_sums = Tensor();
    if (lt_matmul(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, g)) {
      Tensor sums = f.c_col_sums;
      bias_grad(c, m, n, 1, sums);
      return;
    }
  }
  Backend::gemm_fused(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, f);
}

}  // namespace tandem::backend
