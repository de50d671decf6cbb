// Scenarios with known gradients: each rank's loss is sum(p * c_r), so the gradient it contributes
// is c_r exactly, and under SGD with lr 1 a parameter falls by exactly the synchronised gradient.
// The expectation of each mode (average, f16 average, top-K, threshold) is computed here from c_r.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "worker_util.h"

namespace distopt_worker {

namespace {

void expect_buckets_are_params(const Fixture& f) {
  std::vector<int64_t> got = f.opt->bucket_sizes(), want = f.sizes;
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  CHECK_OR_REPORT(got == want, "expected one bucket per parameter (%zu buckets for %zu parameters)", got.size(),
                  want.size());
}

// The indices of the k largest |v|; reports a tie at the cut, which would make the choice ambiguous.
std::vector<bool> top_k_mask(const std::vector<float>& v, int64_t k, const char* what) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    return std::fabs(v[static_cast<size_t>(a)]) > std::fabs(v[static_cast<size_t>(b)]);
  });
  std::vector<bool> mask(v.size(), false);
  for (int64_t i = 0; i < k; ++i) mask[static_cast<size_t>(idx[static_cast<size_t>(i)])] = true;
  if (k < static_cast<int64_t>(v.size()))
    CHECK_OR_REPORT(std::fabs(v[static_cast<size_t>(idx[static_cast<size_t>(k - 1)])]) >
                        std::fabs(v[static_cast<size_t>(idx[static_cast<size_t>(k)])]),
                    "%s: test data has a tie at the top-%lld cut", what, static_cast<long long>(k));
  return mask;
}

}  // namespace

void scenario_plain(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {37, 300, 5, 256};
  Fixture f = make_fixture(comm, sizes, small_buckets());
  CHECK_OR_REPORT(f.opt->bucket_sizes().size() >= 3, "expected several buckets, got %zu",
                  f.opt->bucket_sizes().size());
  // Which parameters each rank's loss uses, per step. From step 3 on, parameter 1 takes part only on
  // rank 0 and parameter 3 nowhere: the others contribute zeros for them, and every bucket still travels.
  auto used = [](int step, int r, size_t i) { return step < 3 || (i == 1 ? r == 0 : i != 3); };
  for (int step = 0; step < 5; ++step) {  // from the second on, the buckets are those rebuilt after the first
    GradFn g = [step](int r, size_t i, int64_t j) {
      return static_cast<float>((j * 7 + static_cast<int64_t>(i) * 3 + step * 5) % 23 - 11) * 0.125f *
                 static_cast<float>(r + 1) +
             0.5f * static_cast<float>(r);
    };
    GradFn g_used = [&](int r, size_t i, int64_t j) { return used(step, r, i) ? g(r, i, j) : 0.0f; };
    std::vector<Tensor> mine;
    std::vector<size_t> index;
    for (size_t i = 0; i < sizes.size(); ++i)
      if (used(step, me, i)) {
        mine.push_back(f.params[i]);
        index.push_back(i);
      }
    GradFn g_mine = [&](int r, size_t k, int64_t j) { return g(r, index[k], j); };
    // Gradients dropped (not zeroed) between steps must not detach them from what is sent.
    if (step == 2) f.sgd->zero_grad(true);
    // In the first step, the odd ranks' backward reaches the parameters in the opposite order: the
    // buckets rebuilt from it must still be laid out alike on every rank.
    bool reversed = step == 0 && me % 2 == 1;
    Change c = measure_change(f, [&] { f.opt->backward_and_update(known_loss(mine, me, g_mine, reversed)); });
    Expect e = average(W, sizes, as_contrib(g_used), kF32Eps);
    expect_near(strf("plain step %d", step), c.drop, e.value, e.tol, &c.rounding);
  }
}

void scenario_half(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {300, 41, 256};
  const double f16_floor = W * std::ldexp(1.0, -24);  // f16's smallest subnormal step
  {
    Fixture f = make_fixture(comm, sizes, small_buckets());
    for (int step = 0; step < 2; ++step) {
      GradFn g = [step](int r, size_t i, int64_t j) {
        return static_cast<float>((j * 13 + static_cast<int64_t>(i) * 5 + r * 7 + step * 3) % 97 - 48) / 7.0f;
      };
      Change c = measure_change(f, [&] { f.opt->backward_and_update_half(known_loss(f.params, me, g)); });
      // Each rank's share is rounded to f16 once and each partial sum once: W roundings of at most
      // one unit of the summed magnitudes.
      Expect e = average(W, sizes, as_contrib(g), 1.5 * kF16Unit, f16_floor);
      expect_near(strf("half f16 step %d", step), c.drop, e.value, e.tol, &c.rounding);
    }
  }
  {  // Each rank's gradient near the f16 maximum: their f16 sum would overflow, their average does not.
    Fixture f = make_fixture(comm, sizes, small_buckets());
    GradFn g = [](int r, size_t i, int64_t j) {
      float sign = (j + static_cast<int64_t>(i)) % 2 ? -1.0f : 1.0f;
      return sign * (60000.0f - 250.0f * static_cast<float>(r) - 300.0f * static_cast<float>(j % 8));
    };
    double smallest = 60000.0 - 250.0 * (W - 1) - 300.0 * 7;
    CHECK_OR_REPORT(W == 1 || 2 * smallest > 65504.0, "test data: the f16 sum of the gradients must overflow");
    Change c = measure_change(f, [&] { f.opt->backward_and_update_half(known_loss(f.params, me, g)); });
    Expect e = average(W, sizes, as_contrib(g), 1.5 * kF16Unit);
    expect_near("half near the f16 maximum", c.drop, e.value, e.tol, &c.rounding);
  }
  {  // Clipping bounds each rank's gradient values before they are averaged.
    Fixture f = make_fixture(comm, sizes, small_buckets());
    const double clip = 3.0;
    GradFn g = [](int r, size_t i, int64_t j) {
      return static_cast<float>((j * 11 + r * 5 + static_cast<int64_t>(i)) % 21 - 10) * 0.5f;
    };
    Contrib clipped = [&](int r, size_t i, int64_t j) { return std::clamp<double>(g(r, i, j), -clip, clip); };
    Change c = measure_change(f, [&] { f.opt->backward_and_update_half(known_loss(f.params, me, g), true, clip); });
    Expect e = average(W, sizes, clipped, 1.5 * kF16Unit, f16_floor);
    expect_near("half with clipping at 3", c.drop, e.value, e.tol, &c.rounding);
  }
  if (W > 1) {  // Half the bytes of plain mode, in as many collectives.
    Fixture plain = make_fixture(comm, sizes, small_buckets()), half = make_fixture(comm, sizes, small_buckets());
    GradFn one = [](int, size_t, int64_t) { return 1.0f; };
    plain.opt->backward_and_update(known_loss(plain.params, me, one));
    half.opt->backward_and_update_half(known_loss(half.params, me, one));
    const dist::CommStats &p = plain.opt->stats(), &h = half.opt->stats();
    const int64_t slack = static_cast<int64_t>(plain.opt->bucket_sizes().size());  // a byte of rounding per bucket
    // Both modes also agree on which parameters some rank used: one f32 flag per parameter, in either mode.
    const int64_t usage = usage_wire(static_cast<int64_t>(sizes.size()), W);
    CHECK_OR_REPORT(p.collectives == h.collectives && p.collectives >= 3, "collectives: plain %lld, half %lld",
                    static_cast<long long>(p.collectives), static_cast<long long>(h.collectives));
    CHECK_OR_REPORT(h.bytes_sent > usage && std::llabs(2 * (h.bytes_sent - usage) - (p.bytes_sent - usage)) <= 2 * slack,
                    "bytes sent: plain %lld, half %lld (each with %lld of usage flags)",
                    static_cast<long long>(p.bytes_sent), static_cast<long long>(h.bytes_sent),
                    static_cast<long long>(usage));
  }
  {  // bf16 on the wire: the same average within bf16 rounding.
    dist::DistOptOptions o = small_buckets();
    o.sync.half_dtype = DType::bf16;
    Fixture f = make_fixture(comm, sizes, o);
    GradFn g = [](int r, size_t i, int64_t j) {
      return static_cast<float>((j * 17 + static_cast<int64_t>(i) + r * 3) % 89 - 44) * 1.37f;
    };
    Change c = measure_change(f, [&] { f.opt->backward_and_update_half(known_loss(f.params, me, g)); });
    Expect e = average(W, sizes, as_contrib(g), 1.5 * kBf16Unit);
    expect_near("half bf16", c.drop, e.value, e.tol, &c.rounding);
  }
}

void scenario_topk(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  // 256 floats fill a 1 KiB bucket and 700 exceed one: each parameter is a bucket of its own.
  const std::vector<int64_t> sizes = {256, 700, 256};
  // spars = 7/100; k = ceil(7n/100) in integers (7/100 * 700 is 49, not the 50 a rounded product gives).
  const int64_t num = 7, den = 100;
  const double spars = 0.07;
  Fixture f = make_fixture(comm, sizes, small_buckets());
  expect_buckets_are_params(f);
  for (int step = 0; step < 2; ++step) {
    // Distinct magnitudes, all below 1, in a rank-dependent order.
    GradFn g = [step, sizes](int r, size_t i, int64_t j) {
      int64_t n = sizes[i];
      int64_t perm = (j * 37 + r * 101 + static_cast<int64_t>(i) * 13 + step * 59) % n;
      double mag = static_cast<double>(perm + 1) / static_cast<double>(n + 1);
      return static_cast<float>(j % 3 == 1 ? -mag : mag);
    };
    // Which elements each rank sends: the k largest magnitudes of its own gradient, per bucket.
    std::vector<Values> sent(static_cast<size_t>(W));
    for (int r = 0; r < W; ++r)
      for (size_t i = 0; i < sizes.size(); ++i) {
        std::vector<float> v(static_cast<size_t>(sizes[i]));
        for (int64_t j = 0; j < sizes[i]; ++j) v[static_cast<size_t>(j)] = g(r, i, j);
        std::vector<bool> mask = top_k_mask(v, (num * sizes[i] + den - 1) / den, "topk");
        sent[static_cast<size_t>(r)].emplace_back(v.size());
        for (size_t j = 0; j < v.size(); ++j) sent[static_cast<size_t>(r)][i][j] = mask[j] ? v[j] : 0.0;
      }
    Contrib contrib = [&](int r, size_t i, int64_t j) { return sent[static_cast<size_t>(r)][i][static_cast<size_t>(j)]; };
    Change c = measure_change(
        f, [&] { f.opt->backward_and_sparse_update(known_loss(f.params, me, g), spars, true, false); });
    Expect e = average(W, sizes, contrib, 2 * kF32Eps);
    expect_near(strf("sparseTopK step %d", step), c.drop, e.value, e.tol, &c.rounding);
  }
  // The traffic of one step: per bucket, k (index, value) pairs of 8 bytes to each other rank.
  f.opt->reset_stats();
  GradFn ramp = [](int r, size_t, int64_t j) { return static_cast<float>((j * 7 + r) % 101) / 128.0f; };
  f.opt->backward_and_sparse_update(known_loss(f.params, me, ramp), spars, true, false);
  int64_t bytes = 0;
  for (int64_t n : f.opt->bucket_sizes()) bytes += 8 * ((num * n + den - 1) / den) * (W - 1);
  // And one all-reduce of the parameters' usage flags.
  bytes += usage_wire(static_cast<int64_t>(sizes.size()), W);
  const dist::CommStats& st = f.opt->stats();
  if (W > 1)
    CHECK_OR_REPORT(st.steps == 1 && st.collectives == 4 && st.bytes_sent == bytes && st.bytes_received == bytes,
                    "sparseTopK traffic: %lld steps, %lld collectives, %lld bytes sent, %lld received; expected 1, 4, "
                    "%lld, %lld", static_cast<long long>(st.steps), static_cast<long long>(st.collectives),
                    static_cast<long long>(st.bytes_sent), static_cast<long long>(st.bytes_received),
                    static_cast<long long>(bytes), static_cast<long long>(bytes));
}

void scenario_threshold(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {256, 100, 300};
  const double threshold = 0.3;
  const float at = static_cast<float>(threshold), below = std::nextafter(at, 0.0f);
  Fixture f = make_fixture(comm, sizes, small_buckets());
  auto check = [&](const std::string& what, const GradFn& g) {
    Contrib contrib = [&](int r, size_t i, int64_t j) {
      float v = g(r, i, j);
      return std::fabs(v) >= at ? static_cast<double>(v) : 0.0;  // |g| >= spars is sent, the rest is not
    };
    Change c = measure_change(
        f, [&] { f.opt->backward_and_sparse_update(known_loss(f.params, me, g), threshold, false, false); });
    Expect e = average(W, sizes, contrib, 2 * kF32Eps);
    expect_near(what, c.drop, e.value, e.tol, &c.rounding);
  };
  // Values exactly at the threshold (either sign), just below it, well above and well below.
  check("sparseThreshold at and below the threshold", [&](int r, size_t i, int64_t j) {
    switch ((j + r + static_cast<int64_t>(i)) % 6) {
      case 0: return at;
      case 1: return -at;
      case 2: return below;
      case 3: return -below;
      case 4: return 0.5f + 0.01f * static_cast<float>(j % 7 + r);
      default: return -0.001f * static_cast<float>(j % 11 + 1);
    }
  });
  // Nothing reaches the threshold on any rank: nothing is sent, nothing changes.
  check("sparseThreshold with every value just below", [&](int, size_t, int64_t j) { return j % 2 ? below : -below; });
  // Only the last rank sends anything.
  check("sparseThreshold with one sending rank", [&](int r, size_t i, int64_t j) {
    return r == W - 1 && (j + static_cast<int64_t>(i)) % 3 == 0 ? -0.75f : 0.25f;
  });
}

void scenario_layout(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  // One parameter four times the bucket size, then 300 tiny ones (4, 8 or 12 values) over many buckets.
  std::vector<int64_t> sizes = {1000};
  for (int i = 0; i < 300; ++i) sizes.push_back(4 * (1 + i % 3));
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  // Exactly a quarter of every parameter (hence of every bucket) has a large magnitude, all below 1:
  // top-K with spars 1/4 and a threshold between the two ranges both send exactly those.
  auto large = [](int r, size_t i, int64_t j) { return (j + r + static_cast<int64_t>(i)) % 4 == 0; };
  GradFn g = [&](int r, size_t i, int64_t j) {
    double frac = static_cast<double>((j * 31 + static_cast<int64_t>(i) * 17 + r * 7) % 101) / 101.0;
    double mag = large(r, i, j) ? 0.5 + 0.45 * frac : 0.05 + 0.3 * frac;
    return static_cast<float>((j + static_cast<int64_t>(i)) % 2 ? -mag : mag);
  };
  Contrib only_large = [&](int r, size_t i, int64_t j) { return large(r, i, j) ? static_cast<double>(g(r, i, j)) : 0.0; };
  auto layout_ok = [&](const Fixture& f) {
    std::vector<int64_t> b = f.opt->bucket_sizes();
    int64_t sum = std::accumulate(b.begin(), b.end(), int64_t{0});
    CHECK_OR_REPORT(sum == total, "buckets hold %lld values, the parameters %lld", static_cast<long long>(sum),
                    static_cast<long long>(total));
    CHECK_OR_REPORT(b.size() >= 10, "expected many buckets for %zu parameters, got %zu", sizes.size(), b.size());
    CHECK_OR_REPORT(std::count(b.begin(), b.end(), int64_t{1000}) == 1,
                    "the parameter larger than a bucket should be a bucket of its own");
  };
  struct Case {
    const char* name;
    std::function<void(dist::DistOpt&, const Tensor&)> run;
    Contrib contrib;
    double unit, floor;
  };
  const std::vector<Case> cases = {
      {"plain", [](dist::DistOpt& o, const Tensor& l) { o.backward_and_update(l); }, as_contrib(g), kF32Eps, 0.0},
      {"half", [](dist::DistOpt& o, const Tensor& l) { o.backward_and_update_half(l); }, as_contrib(g),
       1.5 * kF16Unit, W * std::ldexp(1.0, -24)},
      {"sparseTopK", [](dist::DistOpt& o, const Tensor& l) { o.backward_and_sparse_update(l, 0.25, true, false); },
       only_large, 2 * kF32Eps, 0.0},
      {"sparseThreshold",
       [](dist::DistOpt& o, const Tensor& l) { o.backward_and_sparse_update(l, 0.45, false, false); }, only_large,
       2 * kF32Eps, 0.0},
  };
  for (const Case& k : cases) {
    Fixture f = make_fixture(comm, sizes, small_buckets());
    layout_ok(f);
    Expect e = average(W, sizes, k.contrib, k.unit, k.floor);
    for (int step = 0; step < 2; ++step) {  // the layout guessed at first, then the one rebuilt from step 1
      Change c = measure_change(f, [&] { k.run(*f.opt, known_loss(f.params, me, g)); });
      expect_near(strf("%s over %zu parameters, step %d", k.name, sizes.size(), step), c.drop, e.value, e.tol,
                  &c.rounding);
    }
    layout_ok(f);
  }
}

}  // namespace distopt_worker
