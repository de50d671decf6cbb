// CPU backend: embedding lookups and their gradient. Every index is checked before anything is written:
// a bad one throws naming its position. The gradient adds rows in the order of the indices (column
// ranges run in parallel), so the CPU's sums are the same on every run.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_dispatch.h"
#include "backend/cpu/cpu_parallel.h"

namespace tandem::backend {

namespace {

// The indices as i64, after checking each lies in [0, rows).
std::vector<int64_t> checked_indices(const Tensor& indices, int64_t rows, const char* op) {
  const int64_t n = indices.numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  auto copy = [&](const auto* p) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = static_cast<int64_t>(p[i]);
      TANDEM_CHECK(v >= 0 && v < rows, op, ": index ", v, " at position ", i, " is outside [0, ", rows,
                   ") (the weight has ", rows, " rows)");
      out[static_cast<size_t>(i)] = v;
    }
  };
  if (indices.dtype() == DType::i32)
    copy(indices.data<int32_t>());
  else if (indices.dtype() == DType::i64)
    copy(indices.data<int64_t>());
  else
    TANDEM_CHECK(false, op, ": indices must be i32 or i64, got ", indices.str());
  return out;
}

}  // namespace

void CpuBackend::embedding_forward(const Tensor& weight, const Tensor& indices, Tensor& out) {
  const int64_t v = weight.size(0), d = weight.size(1);
  const std::vector<int64_t> idx = checked_indices(indices, v, "embedding");
  const int64_t n = static_cast<int64_t>(idx.size());
  TANDEM_ASSERT(out.numel() == n * d && out.dtype() == weight.dtype(), "embedding into ", out.str());
  const size_t row_bytes = static_cast<size_t>(d) * dtype_size(weight.dtype());
  const auto* src = static_cast<const unsigned char*>(weight.data_ptr());
  auto* dst = static_cast<unsigned char*>(out.data_ptr());
  cpu::parallel_for(n, cpu::grain_for(d), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(dst + static_cast<size_t>(i) * row_bytes, src + static_cast<size_t>(idx[i]) * row_bytes, row_bytes);
  });
}

void CpuBackend::embedding_backward(const Tensor& dy, const Tensor& indices, bool /*deterministic*/,
                                    Tensor& dweight) {
  dweight.zero_();
  (void)embedding_backward_add(dy, indices, true, dweight);
}

bool CpuBackend::embedding_backward_add(const Tensor& dy, const Tensor& indices, bool /*deterministic*/,
                                        Tensor& dweight) {
  const int64_t v = dweight.size(0), d = dweight.size(1);
  const std::vector<int64_t> idx = checked_indices(indices, v, "embedding backward");
  const int64_t n = static_cast<int64_t>(idx.size());
  TANDEM_ASSERT(dy.numel() == n * d && dy.dtype() == dweight.dtype(), "embedding backward of ", dy.str(), " into ",
                dweight.str());
  dispatch_float(dweight.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    T* dw = dweight.data<T>();
    const T* g = dy.data<T>();
    // Columns split across threads; within a column the rows are added in index order.
    cpu::parallel_for(d, cpu::grain_for(n), [&](int64_t c0, int64_t c1) {
      for (int64_t i = 0; i < n; ++i) {
        T* row = dw + idx[i] * d;
        const T* src = g + i * d;
        for (int64_t c = c0; c < c1; ++c) row[c] += src[c];
      }
    });
  });
  return true;
}

}  // namespace tandem::backend
