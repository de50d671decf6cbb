// CPU backend: 2-D convolution as im2col + GEMM, one image (and group of channels) per GEMM.
//
// Images are handed out to the backend's threads one at a time and each thread runs single-threaded
// GEMMs with its own im2col buffer: per-image GEMMs land directly in the NCHW layout (no
// transposes), their operands stay in cache, and the threads need no synchronisation. When there
// are fewer images than threads, the images run in turn and each GEMM is split instead.
#include <algorithm>
#include <cstring>
#include <vector>

// The im2col rows are short (often one vector); GCC would turn each row copy into a memcpy call.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

using namespace cpu;

namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Output positions o in [0, out) whose input coordinate o*stride - pad + offset lies in [0, in).
void valid_range(int64_t in, int64_t out, int64_t stride, int64_t pad, int64_t offset, int64_t& lo, int64_t& hi) {
  lo = std::clamp<int64_t>(-floor_div(offset - pad, stride), 0, out);  // ceil((pad - offset) / stride)
  hi = std::clamp<int64_t>(floor_div(in - 1 + pad - offset, stride) + 1, 0, out);
  if (hi < lo) hi = lo;
}

bool is_pointwise(const ConvGeom& g) {
  return g.r == 1 && g.s == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 && g.pad_w == 0;
}

// Valid output ranges per kernel row r ([oh_lo, oh_hi)) and column s ([ow_lo, ow_hi)): the outputs
// whose tap reads a real input element rather than padding. Computed once per call.
struct ColPlan {
  std::vector<int64_t> oh_lo, oh_hi, ow_lo, ow_hi;
  explicit ColPlan(const ConvGeom& g) : oh_lo(g.r), oh_hi(g.r), ow_lo(g.s), ow_hi(g.s) {
    for (int64_t r = 0; r < g.r; ++r) valid_range(g.h, g.oh, g.stride_h, g.pad_h, r, oh_lo[r], oh_hi[r]);
    for (int64_t s = 0; s < g.s; ++s) valid_range(g.w, g.ow, g.stride_w, g.pad_w, s, ow_lo[s], ow_hi[s]);
  }
};

template <typename T>
inline void zero_run(T* d, int64_t n) {
  if (n > 0) std::memset(d, 0, sizeof(T) * n);
}

template <typename T>
inline void copy_run_strided(T* __restrict d, const T* __restrict src, int64_t n, int64_t stride) {
  for (int64_t j = 0; j < n; ++j) d[j] = src[j * stride];
}

template <typename T>
inline void add_run_strided(T* __restrict d, const T* __restrict src, int64_t n, int64_t stride) {
  for (int64_t j = 0; j < n; ++j) d[j * stride] += src[j];
}

// A block of rows x width elements: d[i*ds + j] (op)= s[i*ss + j]. Rows are short (the output width,
// often 8 to 32), so common widths get a compile-time width: one or a few vector moves per row.
template <bool Add, int W, typename T>
void block_fixed(T* __restrict d, int64_t ds, const T* __restrict s, int64_t ss, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i, d += ds, s += ss)
    for (int j = 0; j < W; ++j) {
      if constexpr (Add)
        d[j] += s[j];
      else
        d[j] = s[j];
    }
}

template <bool Add, typename T>
void block(T* __restrict d, int64_t ds, const T* __restrict s, int64_t ss, int64_t rows, int64_t width) {
  switch (width) {
    case 4: return block_fixed<Add, 4>(d, ds, s, ss, rows);
    case 8: return block_fixed<Add, 8>(d, ds, s, ss, rows);
    case 12: return block_fixed<Add, 12>(d, ds, s, ss, rows);
    case 16: return block_fixed<Add, 16>(d, ds, s, ss, rows);
    case 24: return block_fixed<Add, 24>(d, ds, s, ss, rows);
    case 32: return block_fixed<Add, 32>(d, ds, s, ss, rows);
    default:
      for (int64_t i = 0; i < rows; ++i, d += ds, s += ss)
        for (int64_t j = 0; j < width; ++j) {
          if constexpr (Add)
            d[j] += s[j];
          else
            d[j] = s[j];
        }
  }
}

// col [c*r*s, oh*ow] <- the receptive fields of one image x [c, h, w]; padding reads as zero.
template <typename T>
void im2col(const T* __restrict x, const ConvGeom& g, const ColPlan& plan, T* __restrict col) {
  const int64_t p = g.oh * g.ow, ow = g.ow, sh = g.stride_h, sw = g.stride_w;
  T* dst = col;
  for (int64_t c = 0; c < g.c; ++c) {
    const T* plane = x + c * g.h * g.w;
    for (int64_t r = 0; r < g.r; ++r) {
      const int64_t oh_lo = plan.oh_lo[r], oh_hi = plan.oh_hi[r];
      for (int64_t s = 0; s < g.s; ++s, dst += p) {
        const int64_t ow_lo = plan.ow_lo[s], cnt = plan.ow_hi[s] - ow_lo;
        zero_run(dst, oh_lo * ow);
        zero_run(dst + oh_hi * ow, (g.oh - oh_hi) * ow);
        if (oh_lo == oh_hi) continue;
        if (cnt == 0) {
          zero_run(dst + oh_lo * ow, (oh_hi - oh_lo) * ow);
          continue;
        }
        // First valid element of the first valid row; each further output row moves stride_h input rows.
        const T* src = plane + (oh_lo * sh - g.pad_h + r) * g.w + ow_lo * sw + s - g.pad_w;
        T* d = dst + oh_lo * ow;
        const int64_t rows = oh_hi - oh_lo;
        if (cnt < ow) {  // horizontal padding: zero the columns outside [ow_lo, ow_lo + cnt)
          for (int64_t i = 0; i < rows; ++i) {
            for (int64_t j = 0; j < ow_lo; ++j) d[i * ow + j] = T(0);
            for (int64_t j = ow_lo + cnt; j < ow; ++j) d[i * ow + j] = T(0);
          }
        }
        if (sw == 1) {
          block<false>(d + ow_lo, ow, src, sh * g.w, rows, cnt);
        } else {
          for (int64_t i = 0; i < rows; ++i) copy_run_strided(d + i * ow + ow_lo, src + i * sh * g.w, cnt, sw);
        }
      }
    }
  }
}

// dx [c, h, w] = the sum of col [c*r*s, oh*ow] scattered back over the receptive fields.
template <typename T>
void col2im(const T* __restrict col, const ConvGeom& g, const ColPlan& plan, T* __restrict dx) {
  const int64_t p = g.oh * g.ow, ow = g.ow, sh = g.stride_h, sw = g.stride_w;
  std::memset(dx, 0, sizeof(T) * g.c * g.h * g.w);
  const T* src_row = col;
  for (int64_t c = 0; c < g.c; ++c) {
    T* plane = dx + c * g.h * g.w;
    for (int64_t r = 0; r < g.r; ++r) {
      const int64_t oh_lo = plan.oh_lo[r], oh_hi = plan.oh_hi[r];
      for (int64_t s = 0; s < g.s; ++s, src_row += p) {
        const int64_t ow_lo = plan.ow_lo[s], cnt = plan.ow_hi[s] - ow_lo;
        if (oh_lo == oh_hi || cnt == 0) continue;
        T* d = plane + (oh_lo * sh - g.pad_h + r) * g.w + ow_lo * sw + s - g.pad_w;
        const T* sr = src_row + oh_lo * ow + ow_lo;
        if (sw == 1) {
          block<true>(d, sh * g.w, sr, ow, oh_hi - oh_lo, cnt);
        } else {
          for (int64_t oh = oh_lo; oh < oh_hi; ++oh, d += sh * g.w, sr += ow) add_run_strided(d, sr, cnt, sw);
        }
      }
    }
  }
}

void check_geom(const ConvGeom& g) {
  check_blas_extent(g.k, "the output channel count");
  check_blas_extent(g.group_c() * g.r * g.s, "the receptive field size");
  check_blas_extent(g.oh * g.ow, "the output plane size");
}

// One group's convolution: its slice of the input channels and of the filters. im2col and col2im
// work on a group's slice of an image through it.
ConvGeom one_group(const ConvGeom& g) {
  ConvGeom gg = g;
  gg.c = g.group_c();
  gg.k = g.k / g.groups;
  gg.groups = 1;
  return gg;
}

// Threads that share out the images of a batch; 1 when there are fewer images than threads, in
// which case the images run in turn and each GEMM is split across the threads instead.
int image_threads(int64_t n) {
  const int nt = max_threads();
  return nt > 1 && n >= nt ? nt : 1;
}

// Runs body(task, thread_slot, split_gemm) for every task in [0, count): spread over the threads,
// or in turn with split_gemm set when there is one thread for the images.
template <typename Body>
void for_each_task(int64_t count, int threads, Body body) {
  if (threads > 1) {
    parallel_tasks(count, threads, [&](int64_t i, int slot) { body(i, slot, false); });
    return;
  }
  for (int64_t i = 0; i < count; ++i) body(i, 0, true);
}

template <typename T>
void gemm_any(bool split, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
              int64_t ldb, T beta, T* c, int64_t ldc) {
  if (split)
    gemm_parallel<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
  else
    blas_gemm<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void conv_forward(const T* x, const T* w, const T* bias, const ConvGeom& g, T* y) {
  const ConvGeom gg = one_group(g);
  const int64_t crs = gg.c * g.r * g.s, p = g.oh * g.ow, chw = g.c * g.h * g.w, gchw = gg.c * g.h * g.w;
  const bool direct = is_pointwise(g);
  const int threads = image_threads(g.n);
  Tensor col_t = direct ? Tensor() : scratch<T>(threads * crs * p);
  T* col_base = direct ? nullptr : col_t.data<T>();
  const ColPlan plan(g);
  for_each_task(g.n, threads, [&](int64_t i, int slot, bool split) {
    T* yn = y + i * g.k * p;
    for (int64_t j = 0; j < g.groups; ++j) {
      const T* src = x + i * chw + j * gchw;
      if (!direct) {
        T* col = col_base + slot * crs * p;
        im2col(src, gg, plan, col);
        src = col;
      }
      gemm_any<T>(split, false, false, gg.k, p, crs, w + j * gg.k * crs, crs, src, p, T(0), yn + j * gg.k * p, p);
    }
    if (bias) {
      for (int64_t k = 0; k < g.k; ++k) {
        const T bv = bias[k];
        T* row = yn + k * p;
        for (int64_t j = 0; j < p; ++j) row[j] += bv;
      }
    }
  });
}

template <typename T>
void conv_backward_data(const T* dy, const T* w, const ConvGeom& g, T* dx) {
  const ConvGeom gg = one_group(g);
  const int64_t crs = gg.c * g.r * g.s, p = g.oh * g.ow, chw = g.c * g.h * g.w, gchw = gg.c * g.h * g.w;
  const bool direct = is_pointwise(g);
  const int threads = image_threads(g.n);
  Tensor col_t = direct ? Tensor() : scratch<T>(threads * crs * p);
  T* col_base = direct ? nullptr : col_t.data<T>();
  const ColPlan plan(g);
  for_each_task(g.n, threads, [&](int64_t i, int slot, bool split) {
    for (int64_t j = 0; j < g.groups; ++j) {
      const T* dyn = dy + i * g.k * p + j * gg.k * p;
      const T* wj = w + j * gg.k * crs;
      T* dxn = dx + i * chw + j * gchw;
      if (direct) {
        gemm_any<T>(split, true, false, crs, p, gg.k, wj, crs, dyn, p, T(0), dxn, p);
        continue;
      }
      T* col = col_base + slot * crs * p;
      gemm_any<T>(split, true, false, crs, p, gg.k, wj, crs, dyn, p, T(0), col, p);
      col2im(col, gg, plan, dxn);
    }
  });
}

// dw = sum over images of dy_i col_i^T, db = sum of dy over images and positions. The images are cut
// into a fixed number of consecutive chunks, each summed into its own partial, and the partials
// added in order: the result does not depend on which thread ran which chunk.
template <typename T>
void conv_backward_weight(const T* dy, const T* x, const ConvGeom& g, T* dw, T* db) {
  const ConvGeom gg = one_group(g);
  const int64_t crs = gg.c * g.r * g.s, p = g.oh * g.ow, chw = g.c * g.h * g.w, gchw = gg.c * g.h * g.w;
  const int64_t wsize = g.k * crs;
  if (g.n == 0) {
    if (dw) std::fill(dw, dw + wsize, T(0));
    if (db) std::fill(db, db + g.k, T(0));
    return;
  }
  const bool direct = is_pointwise(g);
  const int threads = image_threads(g.n);
  // A few chunks per thread balance the load; at least four, whatever the thread count, give the
  // same sums on 1, 2 or 4 threads.
  const int64_t chunks = std::min<int64_t>(g.n, std::max(4, max_threads()));
  Tensor col_t = (dw && !direct) ? scratch<T>(threads * crs * p) : Tensor();
  Tensor part_t = (dw && chunks > 1) ? scratch<T>(chunks * wsize) : Tensor();
  Tensor dbp_t = db ? scratch<double>(chunks * g.k) : Tensor();
  T* col_base = col_t.defined() ? col_t.data<T>() : nullptr;
  T* part_base = part_t.defined() ? part_t.data<T>() : dw;
  double* dbp_base = db ? dbp_t.data<double>() : nullptr;
  const ColPlan plan(g);
  for_each_task(chunks, threads, [&](int64_t chunk, int slot, bool split) {
    int64_t lo, hi;
    part_range(g.n, chunk, chunks, lo, hi);
    double* acc = db ? dbp_base + chunk * g.k : nullptr;
    if (acc) std::fill(acc, acc + g.k, 0.0);
    for (int64_t i = lo; i < hi; ++i) {
      const T* dyn = dy + i * g.k * p;
      if (dw) {
        for (int64_t j = 0; j < g.groups; ++j) {
          const T* src = x + i * chw + j * gchw;
          if (!direct) {
            T* col = col_base + slot * crs * p;
            im2col(src, gg, plan, col);
            src = col;
          }
          gemm_any<T>(split, false, true, gg.k, crs, p, dyn + j * gg.k * p, p, src, p, i == lo ? T(0) : T(1),
                      part_base + chunk * wsize + j * gg.k * crs, crs);
        }
      }
      if (acc) {
        for (int64_t k = 0; k < g.k; ++k) {
          const T* row = dyn + k * p;
          double s = 0.0;
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < p; ++j) s += static_cast<double>(row[j]);
          acc[k] += s;
        }
      }
    }
  });
  if (dw && chunks > 1) {
    parallel_for(wsize, grain_for(chunks), [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        T s = part_base[j];
        for (int64_t c = 1; c < chunks; ++c) s += part_base[c * wsize + j];
        dw[j] = s;
      }
    });
  }
  if (db) {
    for (int64_t k = 0; k < g.k; ++k) {
      double s = 0.0;
      for (int64_t c = 0; c < chunks; ++c) s += dbp_base[c * g.k + k];
      db[k] = static_cast<T>(s);
    }
  }
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

template <typename T>
T* mut_ptr_or_null(Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

}  // namespace

void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeom& g, Tensor& y,
                                bool relu) {
  TANDEM_ASSERT(!g.nhwc, "the CPU backend takes NCHW convolutions only");
  TANDEM_ASSERT(x.numel() == g.n * g.c * g.h * g.w && w.numel() == g.k * g.group_c() * g.r * g.s &&
                    y.numel() == g.n * g.k * g.oh * g.ow && (!b.defined() || b.numel() == g.k),
                "conv2d_forward geometry does not match ", x.str(), ", ", w.str(), ", ", y.str());
  check_geom(g);
  ensure_blas_serial();
  dispatch_float(x.dtype(), "conv2d", [&](auto tag) {
    using T = decltype(tag);
    conv_forward<T>(static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()), ptr_or_null<T>(b), g,
                    static_cast<T*>(y.data_ptr()));
  });
  if (relu) unary(Unary::Relu, y, y);
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const ConvGeom& g, Tensor& dx,
                                      bool accumulate) {
  if (accumulate) {  // the CPU gains nothing from fusing: compute, then add
    Tensor part = Tensor::empty(dx.shape(), dx.dtype(), dx.device());
    conv2d_backward_data(dy, w, g, part, false);
    binary(Binary::Add, dx, part, dx);
    return;
  }
  TANDEM_ASSERT(!g.nhwc, "the CPU backend takes NCHW inputs only");
  TANDEM_ASSERT(dy.numel() == g.n * g.k * g.oh * g.ow && w.numel() == g.k * g.group_c() * g.r * g.s &&
                    dx.numel() == g.n * g.c * g.h * g.w,
                "conv2d_backward_data geometry does not match ", dy.str(), ", ", w.str(), ", ", dx.str());
  check_geom(g);
  ensure_blas_serial();
  dispatch_float(dy.dtype(), "conv2d backward", [&](auto tag) {
    using T = decltype(tag);
    conv_backward_data<T>(static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(w.data_ptr()), g,
                          static_cast<T*>(dx.data_ptr()));
  });
}

void CpuBackend::conv2d_backward_weight(const Tensor& dy, const Tensor& x, const ConvGeom& g, Tensor& dw,
                                        Tensor& db) {
  TANDEM_ASSERT(!g.nhwc, "the CPU backend takes NCHW inputs only");
  TANDEM_ASSERT(dy.numel() == g.n * g.k * g.oh * g.ow &&
                    (!dw.defined() || dw.numel() == g.k * g.group_c() * g.r * g.s) &&
                    (!dw.defined() || (x.defined() && x.numel() == g.n * g.c * g.h * g.w)) &&
                    (!db.defined() || db.numel() == g.k),
                "conv2d_backward_weight geometry does not match ", dy.str(), ", ", dw.str(), ", ", db.str());
  if (!dw.defined() && !db.defined()) return;
  check_geom(g);
  ensure_blas_serial();
  dispatch_float(dy.dtype(), "conv2d backward", [&](auto tag) {
    using T = decltype(tag);
    conv_backward_weight<T>(static_cast<const T*>(dy.data_ptr()), dw.defined() ? ptr_or_null<T>(x) : nullptr, g,
                            mut_ptr_or_null<T>(dw), mut_ptr_or_null<T>(db));
  });
}

}  // namespace tandem::backend
