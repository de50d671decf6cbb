// Sparsified all-reduce: each rank sends (index, value) pairs by all-gather and every rank adds all
// ranks' pairs in rank order, so every rank ends with the same sum.
#include "tandem/distributed/sparse_all_reduce.h"

#include <algorithm>
#include <vector>

#include "backend/backend.h"
#include "distributed/engine/codecs/sparse.h"

namespace tandem::dist {

void sparse_all_reduce(Communicator& comm, Tensor& t, Tensor residual, double spars, bool top_k) {
  TANDEM_CHECK(t.defined() && t.dtype() == DType::f32, "sparse all-reduce: the tensor must be f32, got ",
               t.defined() ? t.str() : std::string("None"));
  TANDEM_CHECK(t.device() == comm.device(), "sparse all-reduce: ", t.str(), " is not on the communicator's device, ",
               comm.device().str());
  TANDEM_CHECK(t.is_contiguous(), "sparse all-reduce: ", t.str(), " must be contiguous");
  const int64_t n = t.numel();
  if (residual.defined())
    TANDEM_CHECK(residual.dtype() == DType::f32 && residual.numel() == n && residual.device() == t.device() &&
                     residual.is_contiguous(),
                 "sparse all-reduce: the accumulation ", residual.str(), " must be a contiguous f32 tensor of ", n,
                 " elements on ", t.device().str());
  if (top_k)
    TANDEM_CHECK(spars > 0.0 && spars <= 1.0, "sparse all-reduce: with topK, spars is the fraction of values sent, "
                 "in (0, 1]; got ", spars);
  else
    TANDEM_CHECK(spars >= 0.0, "sparse all-reduce: spars is the magnitude threshold and must not be negative; got ",
                 spars);
  if (n == 0) return;
  backend::Backend& be = backend::backend_for(t.device());
  const int world = comm.size();
  Tensor flat = t.view({n});
  Tensor x = Tensor::empty({n}, DType::f32, t.device());
  if (residual.defined())
    be.binary(backend::Binary::Add, flat, residual.view({n}), x);
  else
    be.copy_bytes(flat.data_ptr(), x.data_ptr(), static_cast<size_t>(n) * 4, t.device().index);

  Tensor pairs, all_pairs;
  std::vector<int64_t> counts(static_cast<size_t>(world));
  if (top_k) {
    const int64_t k = detail::top_k_count(spars, n);
    pairs = Tensor::empty({2 * k}, DType::i32, t.device());
    be.sparse_topk(x, k, pairs);
    all_pairs = Tensor::empty({2 * k * world}, DType::i32, t.device());
    comm.all_gather(pairs, all_pairs)->wait();
    counts.assign(static_cast<size_t>(world), k);
  } else {
    pairs = Tensor::empty({2 * n}, DType::i32, t.device());
    Tensor count = Tensor::empty({1}, DType::i64, t.device());
    Tensor all_counts = Tensor::empty({world}, DType::i64, t.device());
    be.sparse_threshold(x, spars, pairs, count);
    comm.all_gather(count, all_counts)->wait();
    counts = all_counts.to_vector<int64_t>();
    std::vector<int64_t> sizes;
    int64_t total = 0;
    for (int64_t c : counts) {
      sizes.push_back(2 * c);
      total += 2 * c;
    }
    all_pairs = Tensor::empty({std::max<int64_t>(total, 1)}, DType::i32, t.device());
    Tensor out = all_pairs.narrow(0, 0, total);
    comm.all_gatherv(pairs.narrow(0, 0, 2 * counts[static_cast<size_t>(comm.rank())]), out, sizes)->wait();
  }
  if (residual.defined()) {  // what this rank did not send stays behind for the next call
    Tensor r = residual.view({n});
    be.copy_bytes(x.data_ptr(), r.data_ptr(), static_cast<size_t>(n) * 4, t.device().index);
    be.sparse_zero(r, pairs, counts[static_cast<size_t>(comm.rank())]);
  }
  flat.zero_();
  int64_t offset = 0;
  for (int64_t c : counts) {
    if (c > 0) be.sparse_accumulate(flat, all_pairs.narrow(0, offset, 2 * c), c, 1.0);
    offset += 2 * c;
  }
}

}  // namespace tandem::dist
