// CPU backend: indexing along one extent of [outer, n, inner] views (selection, gathers and scatters, in
// a fixed order), padding, one-hot rows, nonzero positions and writes through strided views.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

namespace {

/// Calls f with an unsigned integer type as wide as one element of t: kernels that only move elements.
template <typename F>
void dispatch_size(DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
  }
  TANDEM_ASSERT(false, "element size of ", dtype_name(t));
}

/// index[k] as a position in [0, n): negative ones count from the end; others outside are an Input error.
template <typename I>
int64_t position(I v, int64_t n, const char* op) {
  const int64_t p = v < 0 ? static_cast<int64_t>(v) + n : static_cast<int64_t>(v);
  TANDEM_CHECK(p >= 0 && p < n, op, ": index ", static_cast<int64_t>(v), " is outside [", -n, ", ", n,
               ") (the extent indexed is ", n, ")");
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

/// The m indices as positions in [0, n), checked.
std::vector<int64_t> positions(const Tensor& index, int64_t n, const char* op) {
  std::vector<int64_t> out(static_cast<size_t>(index.numel()));
  dispatch_index(index, op, [&](auto* idx) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = position(idx[k], n, op);
  });
  return out;
}

/// Output position p of pad_axis read from source position q along n.
inline int64_t pad_source(int64_t p, int64_t n, int64_t before, bool reflect) {
  const int64_t t = p - before;
  if (reflect) return t < 0 ? -t : t >= n ? 2 * (n - 1) - t : t;
  return t < 0 ? 0 : t >= n ? n - 1 : t;
}

}  // namespace

void CpuBackend::index_select(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                              Tensor& out) {
  const int64_t m = index.numel();
  TANDEM_ASSERT(x.numel() == outer * n * inner && out.numel() == outer * m * inner && x.dtype() == out.dtype(),
                "index_select extents");
  if (out.numel() == 0) return;
  const std::vector<int64_t> pos = positions(index, n, "index_select");
  dispatch_size(x.dtype(), [&](auto tag) {
    using U = decltype(tag);
    const U* px = static_cast<const U*>(x.data_ptr());
    U* po = static_cast<U*>(out.data_ptr());
    cpu::parallel_for(outer * m, cpu::grain_for(inner), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t o = r / m, j = r % m;
        std::memcpy(po + r * inner, px + (o * n + pos[j]) * inner, static_cast<size_t>(inner) * sizeof(U));
      }
    });
  });
}

void CpuBackend::index_add(const Tensor& g, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                           Tensor& dx) {
  const int64_t m = index.numel();
  TANDEM_ASSERT(g.numel() == outer * m * inner && dx.numel() == outer * n * inner && g.dtype() == dx.dtype(),
                "index_add extents");
  if (dx.numel() == 0) return;
  const std::vector<int64_t> pos = positions(index, n, "index_add");
  dispatch_float(g.dtype(), "index_add", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    T* pd = static_cast<T*>(dx.data_ptr());
    std::memset(pd, 0, dx.nbytes());
    // Threads split outer and inner, never j: every element is summed in the order of j.
    constexpr int64_t kBlock = 512;
    const int64_t blocks = (inner + kBlock - 1) / kBlock;
    cpu::parallel_for(outer * blocks, cpu::grain_for(m * std::min(inner, kBlock)), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t o = t / blocks, i0 = (t % blocks) * kBlock, w = std::min(kBlock, inner - i0);
        for (int64_t j = 0; j < m; ++j) {
          const T* src = pg + (o * m + j) * inner + i0;
          T* dst = pd + (o * n + pos[j]) * inner + i0;
          for (int64_t i = 0; i < w; ++i) dst[i] += src[i];
        }
      }
    });
  });
}

void CpuBackend::gather_elements(const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                                 Tensor& out) {
  const int64_t total = index.numel(), m = outer * inner != 0 ? total / (outer * inner) : 0;
  TANDEM_ASSERT(x.numel() == outer * n * inner && out.numel() == total && x.dtype() == out.dtype(),
                "gather_elements extents");
  if (total == 0) return;
  dispatch_size(x.dtype(), [&](auto tag) {
    using U = decltype(tag);
    const U* px = static_cast<const U*>(x.data_ptr());
    U* po = static_cast<U*>(out.data_ptr());
    dispatch_index(index, "gather_elements", [&](auto* idx) {
      cpu::parallel_for(total, cpu::grain_for(1), [&](int64_t lo, int64_t hi) {
        for (int64_t e = lo; e < hi; ++e) {
          const int64_t i = e % inner, o = e / (m * inner);
          po[e] = px[(o * n + position(idx[e], n, "gather_elements")) * inner + i];
        }
      });
    });
  });
}

void CpuBackend::scatter_elements(const Tensor& src, const Tensor& index, int64_t outer, int64_t n, int64_t inner,
                                  bool accumulate, Tensor& dst) {
  const int64_t total = index.numel(), m = outer * inner != 0 ? total / (outer * inner) : 0;
  TANDEM_ASSERT(src.numel() == total && dst.numel() == outer * n * inner && src.dtype() == dst.dtype(),
                "scatter_elements extents");
  if (total == 0) return;
  auto run = [&](auto tag, auto apply) {
    using T = decltype(tag);
    const T* ps = static_cast<const T*>(src.data_ptr());
    T* pd = static_cast<T*>(dst.data_ptr());
    dispatch_index(index, "scatter_elements", [&](auto* idx) {
      // Threads split outer and inner, never j: positions given twice see the values in the order of j.
      constexpr int64_t kBlock = 512;
      const int64_t blocks = (inner + kBlock - 1) / kBlock;
      cpu::parallel_for(outer * blocks, cpu::grain_for(m * std::min(inner, kBlock)), [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t o = t / blocks, i0 = (t % blocks) * kBlock, w = std::min(kBlock, inner - i0);
          for (int64_t j = 0; j < m; ++j)
            for (int64_t i = i0; i < i0 + w; ++i) {
              const int64_t e = (o * m + j) * inner + i;
              apply(pd[(o * n + position(idx[e], n, "scatter_elements")) * inner + i], ps[e]);
            }
        }
      });
    });
  };
  if (accumulate)
    dispatch_float(src.dtype(), "scatter_elements", [&](auto tag) { run(tag, [](auto& d, auto s) { d += s; }); });
  else
    dispatch_size(src.dtype(), [&](auto tag) { run(tag, [](auto& d, auto s) { d = s; }); });
}

void CpuBackend::copy_into_strided(const Tensor& src, Tensor& dst) {
  TANDEM_ASSERT(src.shape() == dst.shape() && src.dtype() == dst.dtype() && src.is_contiguous(),
                "copy_into_strided ", src.str(), " -> ", dst.str());
  const int64_t total = src.numel();
  if (total == 0) return;
  const int nd = static_cast<int>(dst.dim());
  const Shape& shape = dst.shape();
  const Shape& st = dst.strides();
  dispatch_size(src.dtype(), [&](auto tag) {
    using U = decltype(tag);
    const U* s = static_cast<const U*>(src.data_ptr());
    U* d = static_cast<U*>(dst.data_ptr());
    cpu::parallel_for(total, cpu::grain_for(1), [&](int64_t lo, int64_t hi) {
      for (int64_t e = lo; e < hi; ++e) {
        int64_t rem = e, off = 0;
        for (int k = nd - 1; k >= 0; --k) {
          off += (rem % shape[k]) * st[k];
          rem /= shape[k];
        }
        d[off] = s[e];
      }
    });
  });
}

void CpuBackend::pad_axis(const Tensor& x, int64_t outer, int64_t n, int64_t inner, int64_t before, int64_t after,
                          bool reflect, Tensor& out) {
  const int64_t len = before + n + after;
  TANDEM_ASSERT(x.numel() == outer * n * inner && out.numel() == outer * len * inner && n > 0, "pad extents");
  if (out.numel() == 0) return;
  dispatch_size(x.dtype(), [&](auto tag) {
    using U = decltype(tag);
    const U* px = static_cast<const U*>(x.data_ptr());
    U* po = static_cast<U*>(out.data_ptr());
    cpu::parallel_for(outer * len, cpu::grain_for(inner), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t o = r / len, q = pad_source(r % len, n, before, reflect);
        std::memcpy(po + r * inner, px + (o * n + q) * inner, static_cast<size_t>(inner) * sizeof(U));
      }
    });
  });
}

void CpuBackend::pad_axis_backward(const Tensor& g, int64_t outer, int64_t n, int64_t inner, int64_t before,
                                   int64_t after, bool reflect, Tensor& dx) {
  const int64_t len = before + n + after;
  TANDEM_ASSERT(g.numel() == outer * len * inner && dx.numel() == outer * n * inner && n > 0, "pad_backward extents");
  if (dx.numel() == 0) return;
  dispatch_float(g.dtype(), "pad_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    T* pd = static_cast<T*>(dx.data_ptr());
    cpu::parallel_for(outer * n, cpu::grain_for(inner * 3), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t o = r / n, j = r % n;
        const T* go = pg + o * len * inner;
        T* d = pd + r * inner;
        auto add_from = [&](int64_t p) {
          for (int64_t i = 0; i < inner; ++i) d[i] += go[p * inner + i];
        };
        std::memcpy(d, go + (j + before) * inner, static_cast<size_t>(inner) * sizeof(T));
        if (reflect) {
          if (j >= 1 && j <= before) add_from(before - j);
          if (j >= n - 1 - after && j <= n - 2) add_from(before + 2 * (n - 1) - j);
        } else {
          if (j == 0)
            for (int64_t p = 0; p < before; ++p) add_from(p);
          if (j == n - 1)
            for (int64_t p = before + n; p < len; ++p) add_from(p);
        }
      }
    });
  });
}

void CpuBackend::one_hot(const Tensor& index, int64_t outer, int64_t depth, int64_t inner, double off, double on,
                         Tensor& out) {
  TANDEM_ASSERT(index.numel() == outer * inner && out.numel() == outer * depth * inner, "one_hot extents");
  if (out.numel() == 0) return;
  dispatch_float(out.dtype(), "one_hot", [&](auto tag) {
    using T = decltype(tag);
    T* po = static_cast<T*>(out.data_ptr());
    const T v_off = static_cast<T>(off), v_on = static_cast<T>(on);
    dispatch_index(index, "one_hot", [&](auto* idx) {
      cpu::parallel_for(outer, cpu::grain_for(depth * inner), [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) {
          T* base = po + o * depth * inner;
          std::fill(base, base + depth * inner, v_off);
          for (int64_t i = 0; i < inner; ++i) {
            int64_t v = static_cast<int64_t>(idx[o * inner + i]);
            if (v < 0) v += depth;
            if (v >= 0 && v < depth) base[v * inner + i] = v_on;
          }
        }
      });
    });
  });
}

Tensor CpuBackend::nonzero(const Tensor& x) {
  const int64_t total = x.numel(), nd = x.dim();
  std::vector<int64_t> found;
  dispatch_all(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.data_ptr());
    for (int64_t e = 0; e < total; ++e) {
      bool nz;
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
        nz = static_cast<float>(p[e]) != 0.0f;
      else
        nz = p[e] != T(0);
      if (nz) found.push_back(e);
    }
  });
  const int64_t count = static_cast<int64_t>(found.size());
  Tensor out = Tensor::empty({nd, count}, DType::i64);
  int64_t* po = out.data<int64_t>();
  const Shape& shape = x.shape();
  for (int64_t c = 0; c < count; ++c) {
    int64_t rem = found[c];
    for (int64_t d = nd - 1; d >= 0; --d) {
      po[d * count + c] = rem % shape[d];
      rem /= shape[d];
    }
  }
  return out;
}

}  // namespace tandem::backend
