// powerSGD with known gradients: gradients of low rank come back exactly at a sufficient rank, the
// error-feedback residual is what the approximation missed, and the traffic is the factors'.
#include <algorithm>
#include <cmath>

#include "worker_util.h"

namespace distopt_worker {

namespace {

// A [40, 30] and B [64, 48] are compressed (their factors take far fewer values); the bias [30] and
// C [3, 4] (whose rank-2 factors would not be smaller) travel whole.
const std::vector<Shape> kShapes = {{40, 30}, {30}, {3, 4}, {64, 48}};

// Rank r's gradient at a step: A = U V_r^T with U [40, 2] shared by the ranks, B = u v_r^T; the
// average over ranks then has rank 2 and 1, inside U's and u's column spaces.
float low_rank_grad(int r, int step, size_t i, int64_t j) {
  auto wave = [](double a) { return std::sin(a) + 0.25 * std::cos(3.1 * a); };
  if (i == 0 || i == 3) {
    const int64_t cols = kShapes[i][1], row = j / cols, col = j % cols;
    double v = 0;
    for (int k = 0; k < (i == 0 ? 2 : 1); ++k)
      v += wave(0.37 * row + 1.3 * k + i) * wave(0.29 * col + 0.7 * k + 0.9 * r + 0.4 * step);
    return static_cast<float>(v);
  }
  return static_cast<float>(wave(0.5 * j + r + 0.3 * step + i));
}

dist::DistOptOptions power_sgd(int rank, bool feedback) {
  dist::DistOptOptions o = small_buckets();
  o.sync.method = "powerSGD";
  o.sync.rank = rank;
  o.sync.error_feedback = feedback;
  return o;
}

Fixture shaped_fixture(const std::shared_ptr<dist::Communicator>& comm, const dist::DistOptOptions& o) {
  Fixture f;
  for (const Shape& s : kShapes) {
    f.sizes.push_back(shape_numel(s));
    f.params.push_back(Tensor::zeros(s, DType::f32, g_device).requires_grad_());
  }
  optim::SgdOptions so;
  so.lr = 1.0;
  f.sgd = std::make_shared<optim::SGD>(f.params, so);
  f.opt = std::make_unique<dist::DistOpt>(f.sgd, comm, o);
  return f;
}

// Tolerance relative to each tensor's largest expected value: the factors' rounding spreads over
// the whole matrix.
Values relative_tol(const Values& expected, double rel) {
  Values tol = expected;
  for (auto& p : tol) {
    double scale = 0;
    for (double v : p) scale = std::max(scale, std::fabs(v));
    std::fill(p.begin(), p.end(), rel * scale + 1e-7);
  }
  return tol;
}

}  // namespace

void scenario_power_sgd(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  if (W == 1) return;  // a job of one rank compresses nothing
  {  // Sufficient rank: every step applies exactly the ranks' average, residuals and all.
    Fixture f = shaped_fixture(comm, power_sgd(2, true));
    for (int step = 0; step < 3; ++step) {
      GradFn g = [step](int r, size_t i, int64_t j) { return low_rank_grad(r, step, i, j); };
      Change c = measure_change(f, [&] { f.opt->step(known_loss(f.params, me, g)); });
      Expect e = average(W, f.sizes, as_contrib(g), 0.0);
      expect_near(strf("powerSGD rank 2 on gradients of rank <= 2, step %d", step), c.drop, e.value,
                  relative_tol(e.value, 2e-5), &c.rounding);
    }
    try {
      f.opt->check_consistency();
    } catch (const std::exception& e) {
      CHECK_OR_REPORT(false, "powerSGD: the ranks differ: %s", e.what());
    }
  }
  {  // Rank 1 on a rank-2 average: lossy, and each rank keeps exactly what it did not get across.
    Fixture f = shaped_fixture(comm, power_sgd(1, true));
    Values residual = tabulate(f.sizes, [](size_t, int64_t) { return 0.0; });
    double missed = 0;
    for (int step = 0; step < 3; ++step) {
      GradFn g = [step](int r, size_t i, int64_t j) { return low_rank_grad(r, step, i, j); };
      Change c = measure_change(f, [&] { f.opt->step(known_loss(f.params, me, g)); });
      for (size_t i = 0; i < f.sizes.size(); ++i)
        for (int64_t j = 0; j < f.sizes[i]; ++j) {
          double& res = residual[i][static_cast<size_t>(j)];
          res += g(me, i, j) - c.drop[i][static_cast<size_t>(j)];
          if (i == 0) missed = std::max(missed, std::fabs(res));
        }
      std::vector<double> norms = f.opt->residual_norms();
      for (size_t i = 0; i < f.sizes.size(); ++i) {
        double want = 0;
        for (double v : residual[i]) want += v * v;
        want = std::sqrt(want);
        const bool whole = kShapes[i].size() == 1 || i == 2;
        CHECK_OR_REPORT(std::fabs(norms[i] - (whole ? 0.0 : want)) <= 1e-4 * want + 1e-5,
                        "powerSGD rank 1, step %d: parameter %zu keeps a residual of norm %.7g, expected %.7g", step, i,
                        norms[i], whole ? 0.0 : want);
      }
    }
    CHECK_OR_REPORT(missed > 1e-2, "rank 1 reproduced a rank-2 average (largest miss %.3g): the test data are too "
                    "easy", missed);
  }
  {  // Traffic of one step: per bucket, the whole tensors, P (r x rows) and Q (r x cols), all-reduced.
    Fixture f = shaped_fixture(comm, power_sgd(2, false));
    GradFn g = [](int r, size_t i, int64_t j) { return low_rank_grad(r, 0, i, j); };
    f.opt->step(known_loss(f.params, me, g));  // the buckets are rebuilt when the next step starts
    f.opt->reset_stats();
    f.opt->step(known_loss(f.params, me, g));
    auto wire = [W](int64_t values) { return values * 4 * 2 * (W - 1) / W; };
    int64_t bytes = 0, collectives = 0;
    for (const dist::BucketInfo& b : f.opt->bucket_layout()) {
      int64_t whole = 0, p = 0, q = 0;
      for (int i : b.params) {
        const Shape& s = kShapes[static_cast<size_t>(i)];
        if (i == 0 || i == 3) {
          p += 2 * s[0];
          q += 2 * s[1];
        } else {
          whole += shape_numel(s);
        }
      }
      for (int64_t n : {whole, p, q})
        if (n) {
          bytes += wire(n);
          ++collectives;
        }
    }
    // And the flags of the parameters used.
    bytes += usage_wire(static_cast<int64_t>(f.params.size()), W);
    collectives += W > 1 ? 1 : 0;
    const dist::CommStats& st = f.opt->stats();
    CHECK_OR_REPORT(st.bytes_sent == bytes && st.collectives == collectives,
                    "powerSGD traffic: %lld bytes in %lld collectives, expected %lld in %lld",
                    static_cast<long long>(st.bytes_sent), static_cast<long long>(st.collectives),
                    static_cast<long long>(bytes), static_cast<long long>(collectives));
  }
}

}  // namespace distopt_worker
