// Scenarios on what a step leaves behind and how its settings apply: the gradients a caller reads
// after a step, clipping that applies to the call that asked for it only, and the calls refused.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/error.h"
#include "tandem/ops.h"
#include "worker_util.h"

namespace distopt_worker {

namespace {

// Each parameter's gradient as the caller sees it (p.grad()), on the host.
Values host_grads(const std::vector<Tensor>& ps) {
  std::vector<Tensor> g;
  for (const Tensor& p : ps) g.push_back(p.grad());
  return host_values(g);
}

}  // namespace

void scenario_grads(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  // 1 KiB buckets: the first layout (reverse registration order) packs {4, 3, 2} and {1, 0}; backward
  // below reaches the parameters in registration order, so the rebuilt layout is {0, 1} and {2, 3, 4}.
  const std::vector<int64_t> sizes = {100, 100, 100, 100, 37};
  struct Case {
    const char* name;
    std::function<void(dist::DistOpt&, const Tensor&)> run;
    double unit, floor;
  };
  const std::vector<Case> cases = {
      {"plain", [](dist::DistOpt& o, const Tensor& l) { o.backward_and_update(l); }, kF32Eps, 0.0},
      {"half", [](dist::DistOpt& o, const Tensor& l) { o.backward_and_update_half(l); }, 1.5 * kF16Unit,
       W * std::ldexp(1.0, -24)},
  };
  for (const Case& k : cases) {
    Fixture f = make_fixture(comm, sizes, small_buckets());
    const std::vector<int64_t> first_layout = f.opt->bucket_sizes();
    for (int step = 0; step < 3; ++step) {
      GradFn g = [step](int r, size_t i, int64_t j) {
        return static_cast<float>((j * 5 + static_cast<int64_t>(i) * 11 + step * 7 + r * 3) % 29 - 14) * 0.0625f *
               static_cast<float>(1 + r);
      };
      k.run(*f.opt, known_loss(f.params, me, g, /*reversed=*/true));
      Expect e = average(W, sizes, as_contrib(g), k.unit, k.floor);
      expect_near(strf("%s: .grad() after step %d", k.name, step + 1), host_grads(f.params), e.value, e.tol);
    }
    if (W > 1)
      CHECK_OR_REPORT(f.opt->bucket_sizes() != first_layout, "%s: the buckets were expected to be rebuilt in "
                      "another layout after the first step", k.name);
  }
}

void scenario_clip_switch(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {300, 41};
  const double clip = 3.0;
  dist::DistOptOptions o = small_buckets();
  o.sync.method = "half";  // configured without clipping
  Fixture f = make_fixture(comm, sizes, o);
  GradFn g = [](int r, size_t i, int64_t j) {
    return static_cast<float>((j * 11 + r * 5 + static_cast<int64_t>(i)) % 21 - 10) * 0.5f;
  };
  Contrib clipped = [&](int r, size_t i, int64_t j) { return std::clamp<double>(g(r, i, j), -clip, clip); };
  const double floor = W * std::ldexp(1.0, -24);
  Change c = measure_change(f, [&] { f.opt->backward_and_update_half(known_loss(f.params, me, g), true, clip); });
  Expect e = average(W, sizes, clipped, 1.5 * kF16Unit, floor);
  expect_near("half clipped at 3", c.drop, e.value, e.tol, &c.rounding);
  // The next calls do not ask for clipping: nothing is clipped.
  Expect full = average(W, sizes, as_contrib(g), 1.5 * kF16Unit, floor);
  c = measure_change(f, [&] { f.opt->step(known_loss(f.params, me, g)); });
  expect_near("step() of the configured half after a clipped step", c.drop, full.value, full.tol, &c.rounding);
  c = measure_change(f, [&] { f.opt->backward_and_update_half(known_loss(f.params, me, g)); });
  expect_near("backward_and_update_half after a clipped step", c.drop, full.value, full.tol, &c.rounding);
}

void scenario_clip_norm(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {300, 41, 256};
  GradFn g = [](int r, size_t i, int64_t j) {
    return static_cast<float>((j * 13 + static_cast<int64_t>(i) * 5 + r * 7) % 31 - 15) * 0.125f * (1.0f + r);
  };
  Expect avg = average(W, sizes, as_contrib(g), kF32Eps);
  double sq = 0;
  for (const auto& p : avg.value)
    for (double v : p) sq += v * v;
  const double norm = std::sqrt(sq);
  for (double max_norm : {norm / 4, norm * 4}) {
    Fixture f = make_fixture(comm, sizes, small_buckets());
    Tensor got;
    Change c = measure_change(f, [&] {
      f.opt->backward_and_sync(known_loss(f.params, me, g));
      got = f.opt->clip_grad_norm(max_norm);
      f.opt->update();
    });
    // The hand-computed clip: every averaged gradient times min(1, max_norm / (norm + 1e-6)).
    const double coef = std::min(1.0, max_norm / (norm + 1e-6));
    Values want = avg.value, tol = avg.tol;
    for (size_t i = 0; i < want.size(); ++i)
      for (size_t j = 0; j < want[i].size(); ++j) {
        want[i][j] *= coef;
        tol[i][j] = tol[i][j] * coef + 1e-5 * std::fabs(want[i][j]);
      }
    expect_near(strf("clip_grad_norm(%.4g) of gradients of norm %.4g", max_norm, norm), c.drop, want, tol, &c.rounding);
    const double reported = got.item<double>();
    CHECK_OR_REPORT(std::fabs(reported - norm) <= 1e-5 * norm, "clip_grad_norm returned %.9g, the norm is %.9g",
                    reported, norm);
    // The same norm, to the bit, on every rank.
    Tensor all = Tensor::empty({W}, DType::f32, g_device);
    comm->all_gather(got, all)->wait();
    std::vector<float> norms = all.cpu().to_vector<float>();
    for (float v : norms)
      CHECK_OR_REPORT(std::memcmp(&v, &norms[0], sizeof v) == 0, "ranks computed different norms: %.9g and %.9g", v,
                      norms[0]);
  }
}

// Calls the step API refuses: update() with no backward_and_sync since the last update (it would
// apply the same gradients again), and a loss that reaches none of the optimizer's parameters, with
// every method and under no_sync (the step would change nothing). A refused call changes no
// parameter, and the optimizer then steps as before; accumulation (several backward_and_sync, one
// update) stays legal.
void scenario_misuse(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {100, 37};
  GradFn g = [](int r, size_t i, int64_t j) {
    return static_cast<float>((j * 3 + static_cast<int64_t>(i) * 5 + r) % 9 - 4) * 0.25f;
  };
  Fixture f = make_fixture(comm, sizes, small_buckets());
  auto refused = [&](const char* what, const std::function<void()>& call, const char* needle) {
    const Values before = host_values(f.params);
    const int64_t steps = f.opt->stats().steps;
    try {
      call();
      CHECK_OR_REPORT(false, "%s was accepted", what);
    } catch (const Error& e) {
      CHECK_OR_REPORT(e.kind() == Error::Kind::Input && std::strstr(e.what(), needle) != nullptr,
                      "%s: expected an input error saying '%s', got '%s'", what, needle, e.what());
    }
    CHECK_OR_REPORT(host_values(f.params) == before, "%s changed the parameters", what);
    CHECK_OR_REPORT(f.opt->stats().steps == steps, "%s counted a synchronisation", what);
  };
  const char* again = "update() called without backward_and_sync since the last update";
  const char* stray = "the loss does not depend on any of the optimizer's 2 parameters";
  // Another tensor that requires a gradient: backward runs, but reaches no parameter of f.
  Tensor other = Tensor::ones({5}, DType::f32, g_device).requires_grad_();
  auto stray_loss = [&] { return sum(mul(other, other)); };

  refused("update() before any backward_and_sync", [&] { f.opt->update(); }, again);
  Expect once = average(W, sizes, as_contrib(g), kF32Eps);
  Change c = measure_change(f, [&] {
    f.opt->backward_and_sync(known_loss(f.params, me, g));
    f.opt->update();
  });
  expect_near("a step split in two", c.drop, once.value, once.tol, &c.rounding);
  refused("a second update() after one backward_and_sync", [&] { f.opt->update(); }, again);

  const std::vector<std::pair<const char*, std::function<void(const Tensor&)>>> calls = {
      {"backward_and_sync", [&](const Tensor& l) { f.opt->backward_and_sync(l); }},
      {"step", [&](const Tensor& l) { f.opt->step(l); }},
      {"backward_and_update", [&](const Tensor& l) { f.opt->backward_and_update(l); }},
      {"backward_and_update_half", [&](const Tensor& l) { f.opt->backward_and_update_half(l); }},
      {"backward_and_partial_update", [&](const Tensor& l) { f.opt->backward_and_partial_update(l); }},
      {"backward_and_sparse_update topK", [&](const Tensor& l) { f.opt->backward_and_sparse_update(l, 0.5, true); }},
      {"backward_and_sparse_update threshold",
       [&](const Tensor& l) { f.opt->backward_and_sparse_update(l, 0.1, false); }},
      {"backward_and_sync under no_sync",
       [&](const Tensor& l) {
         auto local_only = f.opt->no_sync();
         f.opt->backward_and_sync(l);
       }},
  };
  for (const auto& [name, call] : calls)
    refused(strf("%s of a loss without the parameters", name).c_str(), [&] { call(stray_loss()); }, stray);
  refused("update() after a refused backward_and_sync", [&] { f.opt->update(); }, again);

  // Two micro-batches, a refused one between them: the step applies the sum of the two.
  Expect twice = average(W, sizes, [&](int r, size_t i, int64_t j) { return 2.0 * g(r, i, j); }, kF32Eps);
  c = measure_change(f, [&] {
    {
      auto local_only = f.opt->no_sync();
      f.opt->backward_and_sync(known_loss(f.params, me, g));
    }
    refused("a loss without the parameters between two micro-batches",
            [&] { f.opt->backward_and_sync(stray_loss()); }, stray);
    f.opt->backward_and_sync(known_loss(f.params, me, g));
    f.opt->update();
  });
  expect_near("two micro-batches, one update", c.drop, twice.value, twice.tol, &c.rounding);
  c = measure_change(f, [&] { f.opt->step(known_loss(f.params, me, g)); });
  expect_near("step() after the refused calls", c.drop, once.value, once.tol, &c.rounding);
}

}  // namespace distopt_worker
