// State a DistOpt carries from step to step, under non-finite steps and loss scaling: an overflowing
// step costs exactly one skipped step (its inf never reaches the error-feedback residuals, PowerSGD's
// Q or partialUpdate's parameters), and residuals stay in unscaled units when the loss scale moves.
#include <cmath>
#include <limits>

#include "tandem/distributed/loss_scaler.h"
#include "worker_util.h"

namespace distopt_worker {

namespace {

// Parameters of these shapes (matrices, so that PowerSGD compresses some) under SGD with lr 1.
Fixture shaped_fixture(const std::shared_ptr<dist::Communicator>& comm, const std::vector<Shape>& shapes,
                       const dist::DistOptOptions& o) {
  Fixture f;
  for (const Shape& s : shapes) {
    f.params.push_back(Tensor::zeros(s, DType::f32, g_device).requires_grad_());
    f.sizes.push_back(shape_numel(s));
  }
  optim::SgdOptions so;
  so.lr = 1.0;
  f.sgd = std::make_shared<optim::SGD>(f.params, so);
  f.opt = std::make_unique<dist::DistOpt>(f.sgd, comm, o);
  return f;
}

// Gradients that are multiples of 1/8, small enough that scaling by powers of two stays exact.
GradFn step_grads(int step) {
  return [step](int r, size_t i, int64_t j) {
    return static_cast<float>((j * 7 + static_cast<int64_t>(i) * 5 + r * 13 + step * 3) % 29 - 14) * 0.125f;
  };
}

const std::vector<Shape> kShapes = {{24, 16}, {16}, {12, 20}};

bool same_values(const Values& a, const Values& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

}  // namespace

// Under every method that carries state, one step whose gradient holds an inf on the last rank is
// skipped, and the run then goes on exactly as one that never took that step: same parameters, same
// residuals, bit for bit, and later steps are not skipped.
void scenario_carried_nonfinite(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  for (const char* method : {"sparseTopK", "sparseThreshold", "powerSGD", "half", "partialUpdate"}) {
    dist::DistOptOptions o = small_buckets();
    o.sync.method = method;
    o.sync.spars = std::string(method) == "sparseThreshold" ? 0.9 : 0.2;
    o.sync.rank = 2;
    o.skip_nonfinite = true;
    Fixture f = shaped_fixture(comm, kShapes, o), clean = shaped_fixture(comm, kShapes, o);
    auto run = [&](Fixture& x, const GradFn& g) {
      x.opt->backward_and_sync(known_loss(x.params, me, g));
      return x.opt->update();
    };
    for (Fixture* x : {&f, &clean}) run(*x, step_grads(0));
    const Values before = host_values(f.params);
    GradFn poisoned = [&](int r, size_t i, int64_t j) {
      return r == W - 1 && i == 0 && j == 5 ? std::numeric_limits<float>::infinity() : step_grads(1)(r, i, j);
    };
    CHECK_OR_REPORT(!run(f, poisoned), "%s: the step with an inf gradient was applied on rank %d", method, me);
    CHECK_OR_REPORT(same_values(host_values(f.params), before), "%s: a skipped step changed the parameters", method);
    for (int step = 2; step <= 4; ++step)
      for (Fixture* x : {&f, &clean})
        CHECK_OR_REPORT(run(*x, step_grads(step)), "%s: finite step %d was skipped after the overflow", method, step);
    const Values got = host_values(f.params), want = host_values(clean.params);
    bool finite = true;
    for (const auto& p : got)
      for (double v : p) finite = finite && std::isfinite(v);
    CHECK_OR_REPORT(finite, "%s: the parameters are not finite after the skipped step", method);
    CHECK_OR_REPORT(same_values(got, want), "%s: after the skipped step the run differs from one without it", method);
    CHECK_OR_REPORT(f.opt->residual_norms() == clean.opt->residual_norms(),
                    "%s: the residuals differ from those of a run without the skipped step", method);
    CHECK_OR_REPORT(f.opt->stats().skipped_updates == 1, "%s: %lld steps skipped, expected 1", method,
                    static_cast<long long>(f.opt->stats().skipped_updates));
  }
}

// Error feedback under a loss scale that doubles at every step: the scaled run (the residual carried
// across scale changes) moves exactly as the unscaled one, since what is kept is in unscaled units.
void scenario_scaled_feedback(const std::shared_ptr<dist::Communicator>& comm) {
  const int me = comm->rank();
  for (const char* method : {"sparseTopK", "powerSGD"}) {
    dist::DistOptOptions o = small_buckets();
    o.sync.method = method;
    o.sync.spars = 0.2;
    dist::DistOptOptions scaled_o = o;
    scaled_o.skip_nonfinite = true;
    Fixture scaled = shaped_fixture(comm, kShapes, scaled_o), plain = shaped_fixture(comm, kShapes, o);
    dist::LossScalerOptions so;
    so.init_scale = 64.0;
    so.growth_interval = 1;
    dist::LossScaler scaler(*scaled.opt, so);
    for (int step = 0; step < 5; ++step) {
      scaled.opt->backward_and_sync(scaler.scale_loss(known_loss(scaled.params, me, step_grads(step))));
      CHECK_OR_REPORT(scaler.update(), "%s: scaled step %d was skipped", method, step);
      plain.opt->step(known_loss(plain.params, me, step_grads(step)));
    }
    CHECK_OR_REPORT(scaler.scale() == 64.0 * 32, "%s: the scale is %g after five growths from 64", method,
                    scaler.scale());
    CHECK_OR_REPORT(same_values(host_values(scaled.params), host_values(plain.params)),
                    "%s: the loss-scaled run with error feedback differs from the unscaled one", method);
  }
}

}  // namespace distopt_worker
