// Scenarios over several steps: error feedback of the sparse modes, and the round robin of partial
// update. Both are followed here by simulating every rank in plain arithmetic; the simulation is
// then held against what the parameters show.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "worker_util.h"

namespace distopt_worker {

namespace {

// A value in [0.05, 0.95) that no small signed sum of others is likely to tie with: the step
// changes the slope in j, so differences between steps still depend on j.
float spread(int64_t j, int step, int r) {
  double slope = 0.6180339887498949 + 0.1234567891 * step;
  double x = static_cast<double>(j + 1) * slope + step * 0.41421356237309503 + r * 0.7320508075688772;
  return static_cast<float>(0.05 + 0.9 * (x - std::floor(x)));
}

std::vector<double> flat(const Values& v) {
  std::vector<double> out;
  for (const auto& p : v) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// One error-feedback run: `steps` sparse steps, then a flush step that sends everything (a zero
// gradient, with top-K over all values or a zero threshold), which reveals the residual left behind.
// Elements are numbered across the parameters; rank r owns those with number % W == r and has a
// zero gradient elsewhere, so every element's change shows what its owner sent. With `reversed`,
// backward reaches the parameters in registration order, so the buckets are rebuilt in another
// layout after the first step and the residual must follow its parameters there.
void feedback_run(const std::shared_ptr<dist::Communicator>& comm, const std::vector<int64_t>& sizes, bool reversed,
                  bool topk, bool corr, int steps) {
  const int W = comm->size(), me = comm->rank();
  std::vector<int64_t> offset = {0};
  for (int64_t n : sizes) offset.push_back(offset.back() + n);
  const int64_t n = offset.back();
  const size_t N = static_cast<size_t>(n);
  const double spars = topk ? 0.125 : 0.6;  // top-K: an eighth of the bucket; threshold: |g| >= 0.6
  const int64_t k = n / 8;
  const float threshold = static_cast<float>(spars);
  const std::string label =
      strf("%s%s, %zu parameter(s), %d steps", topk ? "sparseTopK" : "sparseThreshold",
           corr ? " with error feedback" : " without error feedback", sizes.size(), steps);
  if (topk) CHECK_OR_REPORT(sizes.size() == 1 && n % 8 == 0, "%s: top-K runs use one parameter", label.c_str());
  Fixture f = make_fixture(comm, sizes, small_buckets());
  const std::vector<int64_t> first_layout = f.opt->bucket_sizes();
  auto owner = [W](int64_t J) { return static_cast<int>(J % W); };

  std::vector<std::vector<float>> residual(static_cast<size_t>(W), std::vector<float>(N, 0.0f));
  std::vector<double> raw_total(N, 0.0), sent_total(N, 0.0), expected_sent_total(N, 0.0);
  for (int s = 0; s < steps; ++s) {
    auto grad = [&](int r, int64_t J) {
      if (owner(J) != r) return 0.0f;
      float v = spread(J, s, r);
      return (J / W + s) % 2 ? -v : v;
    };
    GradFn g = [&](int r, size_t i, int64_t j) { return grad(r, offset[i] + j); };
    // Simulate every rank: what it sends this step, and what it keeps.
    std::vector<std::vector<float>> sent(static_cast<size_t>(W), std::vector<float>(N, 0.0f));
    for (int r = 0; r < W; ++r) {
      std::vector<float>& res = residual[static_cast<size_t>(r)];
      std::vector<float> acc(N);
      for (size_t J = 0; J < N; ++J) acc[J] = corr ? grad(r, static_cast<int64_t>(J)) + res[J] : grad(r, static_cast<int64_t>(J));
      std::vector<bool> mask(N);
      if (topk) {
        std::vector<size_t> idx(N);
        std::iota(idx.begin(), idx.end(), size_t{0});
        std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return std::fabs(acc[a]) > std::fabs(acc[b]); });
        CHECK_OR_REPORT(std::fabs(acc[idx[static_cast<size_t>(k) - 1]]) > std::fabs(acc[idx[static_cast<size_t>(k)]]),
                        "%s: test data has a tie at the top-k cut on rank %d, step %d", label.c_str(), r, s);
        for (int64_t i = 0; i < k; ++i) mask[idx[static_cast<size_t>(i)]] = true;
      } else {
        for (size_t J = 0; J < N; ++J) mask[J] = std::fabs(acc[J]) >= threshold;
      }
      for (size_t J = 0; J < N; ++J) {
        sent[static_cast<size_t>(r)][J] = mask[J] ? acc[J] : 0.0f;
        if (corr) res[J] = mask[J] ? 0.0f : acc[J];
      }
    }
    Change c = measure_change(f, [&] {
      f.opt->backward_and_sparse_update(known_loss(f.params, me, g, reversed), spars, topk, corr);
    });
    Values expected = tabulate(sizes, [&](size_t i, int64_t j) {
      int64_t J = offset[i] + j;
      return static_cast<double>(sent[static_cast<size_t>(owner(J))][static_cast<size_t>(J)]) / W;
    });
    Values tol = expected;
    for (auto& p : tol)
      for (double& x : p) x = 2 * kF32Eps * std::fabs(x);
    expect_near(strf("%s: what was sent in step %d", label.c_str(), s), c.drop, expected, tol, &c.rounding);
    std::vector<double> drop = flat(c.drop);
    for (size_t J = 0; J < N; ++J) {
      raw_total[J] += grad(owner(static_cast<int64_t>(J)), static_cast<int64_t>(J));
      sent_total[J] += W * drop[J];  // what the owner sent, as the parameters show it
      expected_sent_total[J] += sent[static_cast<size_t>(owner(static_cast<int64_t>(J)))][J];
    }
  }
  if (reversed && steps > 1)
    CHECK_OR_REPORT(f.opt->bucket_sizes() != first_layout, "%s: the buckets were expected to be rebuilt in another "
                    "layout after the first step", label.c_str());
  // Flush: with error feedback the residual comes out now; without, there is none.
  GradFn zero = [](int, size_t, int64_t) { return 0.0f; };
  Change flush = measure_change(
      f, [&] { f.opt->backward_and_sparse_update(known_loss(f.params, me, zero), topk ? 1.0 : 0.0, topk, corr); });
  std::vector<double> flush_drop = flat(flush.drop);
  Values got = tabulate(sizes, [&](size_t i, int64_t j) {
    size_t J = static_cast<size_t>(offset[i] + j);
    return sent_total[J] + W * flush_drop[J];
  });
  Values want = tabulate(sizes, [&](size_t i, int64_t j) {
    size_t J = static_cast<size_t>(offset[i] + j);
    return corr ? raw_total[J] : expected_sent_total[J];
  });
  Values tol = tabulate(sizes, [&](size_t, int64_t) { return 1e-5 * (steps + 1); });
  expect_near(label + (corr ? ": sent so far + residual = sum of the raw gradients"
                            : ": sent so far = the sum of each step's selection, nothing kept"),
              got, want, tol);
  if (!corr) {
    Values zeros = tabulate(sizes, [](size_t, int64_t) { return 0.0; });
    expect_near(label + ": the flush step sends nothing", flush.drop, zeros, tol);
  }
}

}  // namespace

void scenario_feedback(const std::shared_ptr<dist::Communicator>& comm) {
  for (bool topk : {true, false})
    for (bool corr : {true, false})
      for (int steps : {1, 5}) feedback_run(comm, {96}, false, topk, corr, steps);
  // Threshold decisions are per value, so they can be followed over several parameters and buckets.
  for (bool corr : {true, false}) feedback_run(comm, {200, 100, 60}, true, false, corr, 5);
}

void scenario_partial(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  // 1000 values with 1 KiB buckets: chunks of 256 values cut across the parameters.
  const std::vector<int64_t> sizes = {300, 200, 500};
  Fixture f = make_fixture(comm, sizes, small_buckets());
  // Gradients scaled by (r+1)^2: no rank's gradient equals the average, so on every rank a local
  // value and an averaged one differ by at least a quarter.
  GradFn g = [](int r, size_t i, int64_t j) {
    return static_cast<float>((r + 1) * (r + 1)) * 0.25f * static_cast<float>(1 + (j + static_cast<int64_t>(i)) % 5);
  };
  std::vector<Values> sim(static_cast<size_t>(W), tabulate(sizes, [](size_t, int64_t) { return 0.0; }));
  std::vector<std::vector<std::vector<int>>> averaged_at;  // per parameter, element: the steps that averaged it
  for (int64_t n : sizes) averaged_at.emplace_back(static_cast<size_t>(n));
  auto everything_averaged = [&](size_t times) {
    for (auto& p : averaged_at)
      for (auto& e : p)
        if (e.size() < times) return false;
    return true;
  };
  auto partial_step = [&](int s) {
    f.opt->backward_and_partial_update(known_loss(f.params, me, g));
    Values got = host_values(f.params);
    int64_t averaged_now = 0;
    int bad = 0;
    for (size_t i = 0; i < sizes.size(); ++i)
      for (int64_t j = 0; j < sizes[i]; ++j) {
        size_t u = static_cast<size_t>(j);
        double mean = 0;
        for (int r = 0; r < W; ++r) {
          sim[static_cast<size_t>(r)][i][u] -= g(r, i, j);  // the local step
          mean += sim[static_cast<size_t>(r)][i][u] / W;
        }
        double local = sim[static_cast<size_t>(me)][i][u], v = got[i][u];
        double tol = 1e-6 * (std::fabs(mean) + std::fabs(local)) + 1e-6;
        if (std::fabs(v - mean) <= tol) {
          averaged_at[i][u].push_back(s);
          ++averaged_now;
          for (int r = 0; r < W; ++r) sim[static_cast<size_t>(r)][i][u] = mean;
        } else if (std::fabs(v - local) > tol && bad++ < 5) {
          CHECK_OR_REPORT(false, "partial step %d: parameter %zu element %lld is %.9g: neither its local value %.9g "
                          "nor the average %.9g", s, i, static_cast<long long>(j), v, local, mean);
        }
      }
    CHECK_OR_REPORT(averaged_now > 0, "partial step %d averaged nothing", s);
    return bad == 0;
  };
  int s = 0;
  while (!everything_averaged(1) && s < 40)
    if (!partial_step(s++)) return;
  const int cycle = s;
  CHECK_OR_REPORT(everything_averaged(1), "after %d partial steps some values were never averaged", s);
  CHECK_OR_REPORT(cycle >= 3, "expected the parameters to be cut into several chunks, got a cycle of %d", cycle);
  for (int t = 0; t < cycle; ++t)
    if (!partial_step(s++)) return;
  // Each value averaged exactly once per cycle, at the same position in both cycles.
  int bad = 0;
  for (size_t i = 0; i < sizes.size(); ++i)
    for (size_t u = 0; u < averaged_at[i].size(); ++u) {
      const auto& at = averaged_at[i][u];
      bool ok = at.size() == 2 && at[0] < cycle && at[1] == at[0] + cycle;
      if (!ok && bad++ < 5)
        CHECK_OR_REPORT(false, "parameter %zu element %zu was averaged %zu times in two cycles of %d steps (first at %d)",
                        i, u, at.size(), cycle, at.empty() ? -1 : at[0]);
    }
  // A local step, then average_parameters(): every rank holds the average of all ranks' values.
  f.opt->backward_and_partial_update(known_loss(f.params, me, g));
  f.opt->average_parameters();
  Values expected = tabulate(sizes, [&](size_t i, int64_t j) {
    double mean = 0;
    for (int r = 0; r < W; ++r) mean += (sim[static_cast<size_t>(r)][i][static_cast<size_t>(j)] - g(r, i, j)) / W;
    return mean;
  });
  Values tol = tabulate(sizes, [&](size_t i, int64_t j) { return 1e-6 * std::fabs(expected[i][static_cast<size_t>(j)]) + 1e-6; });
  expect_near("partial: values after average_parameters()", host_values(f.params), expected, tol);
  try {
    f.opt->check_consistency();
  } catch (const std::exception& e) {
    CHECK_OR_REPORT(false, "after average_parameters() the ranks differ: %s", e.what());
  }
}

}  // namespace distopt_worker
