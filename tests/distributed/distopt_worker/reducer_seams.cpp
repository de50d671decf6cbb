// Scenarios on the reducer's seams: what a caller can see (bucket layout, residual norms), the
// inf/NaN verdict every rank shares and the skipped update, and 16-bit gradients reduced without
// overflow and handed over as f32.
#include <algorithm>
#include <cmath>
#include <limits>

#include "distributed/engine/grad_codec.h"
#include "distributed/engine/reducer.h"
#include "worker_util.h"

namespace distopt_worker {

void scenario_introspection(const std::shared_ptr<dist::Communicator>& comm) {
  const int me = comm->rank();
  const std::vector<int64_t> sizes = {37, 300, 5, 256, 96};
  Fixture f = make_fixture(comm, sizes, small_buckets());
  // Every parameter in exactly one bucket, at its offset, buckets tiling the buffer in launch order: each
  // parameter and each bucket at the first 16-byte boundary after the one before (the gaps zero).
  std::vector<dist::BucketInfo> layout = f.opt->bucket_layout();
  std::vector<int> seen(sizes.size(), 0);
  auto aligned = [](int64_t at) { return (at + 3) / 4 * 4; };
  int64_t next = 0;
  for (const dist::BucketInfo& b : layout) {
    CHECK_OR_REPORT(b.offset == aligned(next) && b.params.size() == b.offsets.size() && !b.params.empty(),
                    "bucket at %lld (expected at %lld) with %zu parameters and %zu offsets",
                    static_cast<long long>(b.offset), static_cast<long long>(aligned(next)), b.params.size(),
                    b.offsets.size());
    int64_t at = b.offset;
    for (size_t j = 0; j < b.params.size(); ++j) {
      const size_t i = static_cast<size_t>(b.params[j]);
      CHECK_OR_REPORT(i < sizes.size() && b.offsets[j] == aligned(at), "parameter %zu at %lld, expected at %lld", i,
                      static_cast<long long>(b.offsets[j]), static_cast<long long>(aligned(at)));
      if (i < sizes.size()) {
        ++seen[i];
        at = aligned(at) + sizes[i];
      }
    }
    CHECK_OR_REPORT(at - b.offset == b.numel && b.span == b.numel,
                    "a bucket of %lld values (span %lld) holds parameters up to %lld", static_cast<long long>(b.numel),
                    static_cast<long long>(b.span), static_cast<long long>(at - b.offset));
    CHECK_OR_REPORT(b.numel * 4 <= 1024 || b.params.size() == 1, "a bucket of %lld values exceeds 1 KiB",
                    static_cast<long long>(b.numel));
    next = b.offset + b.numel;
  }
  CHECK_OR_REPORT(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }),
                  "a parameter is missing from the buckets or in two of them");

  // Residual norms: zero without error feedback; with top-K, each parameter's residual is what its
  // bucket did not send. A one-parameter bucket of 96 values sending 12 keeps the other 84 (a job of
  // one rank sends nothing and keeps nothing).
  std::vector<double> zeros = f.opt->residual_norms();
  CHECK_OR_REPORT(zeros.size() == sizes.size() && std::all_of(zeros.begin(), zeros.end(), [](double v) { return v == 0; }),
                  "plain keeps no residual");
  Fixture t = make_fixture(comm, {96}, small_buckets());
  GradFn g = [](int r, size_t, int64_t j) { return static_cast<float>((j * 37 + r * 11) % 96 + 1) / 64.0f; };
  t.opt->backward_and_sparse_update(known_loss(t.params, me, g), 0.125, true, true);
  std::vector<float> v(96);
  for (int64_t j = 0; j < 96; ++j) v[static_cast<size_t>(j)] = g(me, 0, j);
  std::sort(v.begin(), v.end());  // all positive and distinct: the 12 largest are sent
  double kept = 0;
  for (size_t j = 0; j < 84 && comm->size() > 1; ++j) kept += static_cast<double>(v[j]) * v[j];
  std::vector<double> norms = t.opt->residual_norms();
  CHECK_OR_REPORT(norms.size() == 1 && std::fabs(norms[0] - std::sqrt(kept)) <= 1e-5 * std::sqrt(kept),
                  "top-K residual norm %.9g, expected %.9g", norms.empty() ? -1.0 : norms[0], std::sqrt(kept));

  // Which methods a CUDA graph could capture whole: all but the threshold, whose counts the host reads.
  CHECK_OR_REPORT(f.opt->step_capturable() && t.opt->step_capturable(), "plain and top-K steps are capturable");
  t.opt->backward_and_sparse_update(known_loss(t.params, me, g), 0.5, false, true);
  CHECK_OR_REPORT(!t.opt->step_capturable() && t.opt->active_sync().method == "sparseThreshold",
                  "a sparseThreshold step waits on the host: not capturable");
}

void scenario_nonfinite(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {300, 41, 256};
  dist::DistOptOptions o = small_buckets();
  o.skip_nonfinite = true;
  optim::SgdOptions so;
  so.lr = 0.5;
  so.momentum = 0.9;
  auto make = [&] {
    Fixture f;
    f.sizes = sizes;
    for (int64_t n : sizes) f.params.push_back(Tensor::zeros({n}, DType::f32, g_device).requires_grad_());
    f.sgd = std::make_shared<optim::SGD>(f.params, so);
    f.opt = std::make_unique<dist::DistOpt>(f.sgd, comm, o);
    return f;
  };
  auto grads = [](int step) {
    return GradFn([step](int r, size_t i, int64_t j) {
      return static_cast<float>((j * 3 + static_cast<int64_t>(i) + r * 7 + step) % 19 - 9) * 0.25f;
    });
  };
  auto momentum_of = [](Fixture& f) { return host_values(*f.sgd->state_lists()[0].tensors); };
  Fixture f = make(), clean = make();
  for (Fixture* x : {&f, &clean}) x->opt->step(known_loss(x->params, me, grads(0)));
  // Step 2: the last rank's gradient holds an inf. Every rank skips the update.
  Values params_before = host_values(f.params), momentum_before = momentum_of(f);
  GradFn poisoned = [&](int r, size_t i, int64_t j) {
    return r == W - 1 && i == 1 && j == 7 ? std::numeric_limits<float>::infinity() : grads(1)(r, i, j);
  };
  f.opt->backward_and_sync(known_loss(f.params, me, poisoned));
  bool stepped = f.opt->update();
  CHECK_OR_REPORT(!stepped, "the update with an inf gradient was not skipped");
  // The optimizer counts the call (the skip is decided on the device, where its kernels read the verdict).
  CHECK_OR_REPORT(f.opt->stats().skipped_updates == 1 && f.sgd->steps() == 2,
                  "skipped updates %lld, optimizer steps %lld; expected 1 and 2",
                  static_cast<long long>(f.opt->stats().skipped_updates), static_cast<long long>(f.sgd->steps()));
  expect_near("parameters after a skipped step", host_values(f.params), params_before,
              tabulate(sizes, [](size_t, int64_t) { return 0.0; }));
  expect_near("momentum after a skipped step", momentum_of(f), momentum_before,
              tabulate(sizes, [](size_t, int64_t) { return 0.0; }));
  // The next finite step proceeds as if the skipped one had never been taken.
  for (Fixture* x : {&f, &clean}) {
    x->opt->backward_and_sync(known_loss(x->params, me, grads(2)));
    CHECK_OR_REPORT(x->opt->update(), "a finite step was skipped");
  }
  expect_near("after the skipped step, vs a run without it", host_values(f.params), host_values(clean.params),
              tabulate(sizes, [](size_t, int64_t) { return 0.0; }));
}

// The reducer with 16-bit gradients: f16 values near the format's largest, summed, would overflow;
// pre-scaled they are averaged, sent as 2 bytes each, and reach the f32 masters as f32.
void scenario_arena16(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {300, 41, 256};
  std::vector<Tensor> leaves, masters;
  for (int64_t n : sizes) {
    leaves.push_back(Tensor::zeros({n}, DType::f16, g_device).requires_grad_());
    masters.push_back(Tensor::zeros({n}, DType::f32, g_device).requires_grad_());
  }
  dist::CommStats stats;
  dist::detail::Reducer reducer(leaves, comm, {1024, 1024, true, true}, stats, masters);
  std::vector<Shape> shapes;
  for (const Tensor& l : leaves) shapes.push_back(l.shape());
  dist::detail::CodecEnv env{*comm, stats, g_device, me, W, DType::f16, shapes};
  reducer.set_codec(dist::detail::make_codec(env, dist::SyncOptions{}), false);
  // Multiples of 64 near 60,000: exact in f16, as are their halves; two of them sum past 65,504.
  GradFn g = [](int r, size_t i, int64_t j) {
    return static_cast<float>(60032 - 1024 * r - 64 * ((j + static_cast<int64_t>(i)) % 16)) *
           ((j % 2) ? -1.0f : 1.0f);
  };
  reducer.begin(false);
  for (size_t k = leaves.size(); k-- > 0;) {  // as backward would: the last parameter first
    std::vector<float> v(static_cast<size_t>(sizes[k]));
    for (size_t j = 0; j < v.size(); ++j) v[j] = g(me, k, static_cast<int64_t>(j));
    leaves[k].grad().copy_(device_tensor(v, leaves[k].shape()));
    reducer.on_ready(leaves[k]);
  }
  reducer.finish();
  CHECK_OR_REPORT(!reducer.found_nonfinite(), "16-bit average overflowed");
  std::vector<Tensor> got;
  for (const Tensor& m : masters) {
    CHECK_OR_REPORT(m.grad().defined() && m.grad().dtype() == DType::f32, "the master's gradient is not f32");
    got.push_back(m.grad());
  }
  Expect e = average(W, sizes, as_contrib(g), 1.5 * kF16Unit);
  expect_near("16-bit gradients, averaged, as f32", host_values(got), e.value, e.tol);
  // Two bytes per value on the wire (per bucket, nccl-tests accounting), the 4-byte verdict and the flags of
  // the parameters used.
  int64_t wire = (W > 1 ? 4 * 2 * (W - 1) / W : 0) + usage_wire(static_cast<int64_t>(leaves.size()), W);
  for (const auto& b : reducer.buckets()) wire += W > 1 ? b.numel * 2 * 2 * (W - 1) / W : 0;
  CHECK_OR_REPORT(stats.bytes_sent == wire, "bytes sent %lld, expected %lld", static_cast<long long>(stats.bytes_sent),
                  static_cast<long long>(wire));
}

}  // namespace distopt_worker
