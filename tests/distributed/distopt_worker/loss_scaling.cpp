// Dynamic loss scaling: the scaled loss gives exactly the unscaled update (the scale is a power of
// two); a gradient overflow on one rank makes every rank skip the same step and halve its scale; clean
// steps grow it again.
#include <limits>

#include "tandem/distributed/loss_scaler.h"
#include "worker_util.h"

namespace distopt_worker {

void scenario_loss_scaling(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {300, 41, 256};
  dist::DistOptOptions o = small_buckets();
  o.skip_nonfinite = true;
  Fixture scaled = make_fixture(comm, sizes, o), plain = make_fixture(comm, sizes, small_buckets());
  dist::LossScalerOptions so;
  so.init_scale = 1024.0;
  so.growth_interval = 2;
  dist::LossScaler scaler(*scaled.opt, so);
  auto grads = [](int step) {
    return GradFn([step](int r, size_t i, int64_t j) {
      return static_cast<float>((j * 5 + static_cast<int64_t>(i) * 3 + r * 11 + step) % 23 - 11) * 0.125f;
    });
  };
  auto scaled_step = [&](const GradFn& g) {
    scaled.opt->backward_and_sync(scaler.scale_loss(known_loss(scaled.params, me, g)));
    return scaler.update();
  };
  const Values zero = tabulate(sizes, [](size_t, int64_t) { return 0.0; });
  // Step 1: clean. The scaled run moves exactly as the unscaled one.
  CHECK_OR_REPORT(scaled_step(grads(0)), "a clean scaled step was skipped");
  plain.opt->step(known_loss(plain.params, me, grads(0)));
  expect_near("scaled step vs unscaled step", host_values(scaled.params), host_values(plain.params), zero);
  CHECK_OR_REPORT(scaler.scale() == 1024.0, "the scale moved after one clean step: %g", scaler.scale());
  // Step 2: the last rank's gradient overflows. Every rank skips it and halves the scale.
  const Values before = host_values(scaled.params);
  GradFn overflow = [&](int r, size_t i, int64_t j) {
    return r == W - 1 && i == 2 && j == 3 ? std::numeric_limits<float>::max() : grads(1)(r, i, j);
  };
  CHECK_OR_REPORT(!scaled_step(overflow), "the overflowing step was applied on rank %d", me);
  expect_near("parameters after the skipped step", host_values(scaled.params), before, zero);
  CHECK_OR_REPORT(scaler.scale() == 512.0 && scaler.skipped_steps() == 1, "scale %g, %lld skipped; expected 512, 1",
                  scaler.scale(), static_cast<long long>(scaler.skipped_steps()));
  // Every rank holds the same scale: the largest and the smallest over ranks agree.
  Tensor s = device_tensor({static_cast<float>(scaler.scale()), -static_cast<float>(scaler.scale())}, {2});
  comm->all_reduce(s, dist::ReduceOp::Sum)->wait();
  const std::vector<float> sv = s.to_vector<float>();
  CHECK_OR_REPORT(sv[0] == 512.0f * W && sv[1] == -512.0f * W, "the ranks hold different scales");
  // Steps 3 and 4: clean; the run continues as the unscaled one did, and after two clean steps the
  // scale doubles back.
  for (int step = 2; step <= 3; ++step) {
    CHECK_OR_REPORT(scaled_step(grads(step)), "clean step %d was skipped", step);
    plain.opt->step(known_loss(plain.params, me, grads(step)));
  }
  expect_near("after the skip, vs the unscaled run without that step", host_values(scaled.params),
              host_values(plain.params), zero);
  CHECK_OR_REPORT(scaler.scale() == 1024.0, "the scale did not grow back after two clean steps: %g", scaler.scale());
}

}  // namespace distopt_worker
