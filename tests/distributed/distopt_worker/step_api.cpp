// Scenarios on what a step leaves behind and how its settings apply: the gradients a caller reads
// after a step, and clipping that applies to the call that asked for it only.
#include <algorithm>
#include <cmath>

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

}  // namespace distopt_worker
