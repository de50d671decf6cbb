// Parameters a step does not use: the plain optimizer leaves a parameter without a gradient alone (no
// momentum, no weight decay), and so does PyTorch DDP for a parameter no rank used. DistOpt must too,
// under every --shard that steps whole parameters or slices, on any number of ranks; a parameter that
// some rank used is stepped on every rank with the average of the gradients (the others' being zero).
#include <cmath>

#include "tandem/autograd.h"
#include "tandem/ops.h"
#include "worker_util.h"

namespace distopt_worker {

namespace {

Tensor scalar_like(const Tensor& t, double v) { return Tensor::full(t.shape(), v, t.dtype(), t.device()); }

// Parameters a (6 values) and b (5 values), SGD with momentum and weight decay.
struct Model {
  std::vector<Tensor> params;
  std::shared_ptr<optim::SGD> sgd;
};

Model make_model() {
  Model m;
  std::vector<float> a = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f}, b = {1.0f, -2.0f, 0.5f, 3.0f, -0.5f};
  m.params.push_back(device_tensor(a, {6}).requires_grad_());
  m.params.push_back(device_tensor(b, {5}).requires_grad_());
  optim::SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  so.weight_decay = 0.01;
  m.sgd = std::make_shared<optim::SGD>(m.params, so);
  return m;
}

// The loss of a step: a's part always (the same on every rank), b's part when `use_b` (rank-dependent).
Tensor loss_of(const Model& m, int rank, bool use_b) {
  Tensor loss = sum(mul(m.params[0], m.params[0]));
  if (use_b) loss = add(loss, sum(mul(m.params[1], scalar_like(m.params[1], 1.0 + rank))));
  return loss;
}

}  // namespace

void scenario_unused(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  // Step 1 uses both parameters (momentum starts for b too), steps 2 and 3 leave b out on every rank:
  // b must stay where step 1 put it. Step 4 uses b on rank 0 alone: every rank steps b with rank 0's
  // gradient over W (the average), as the reference, a plain SGD over that average, does.
  for (dist::Shard shard : {dist::Shard::none, dist::Shard::optimizer, dist::Shard::gradients}) {
    const std::string what = std::string("shard ") + dist::shard_name(shard);
    Model ref = make_model(), got = make_model();
    dist::DistOptOptions o = small_buckets();
    o.shard = shard;
    dist::DistOpt opt(got.sgd, comm, o);
    auto reference_step = [&](bool b_anywhere, bool b_here_only_rank0) {
      ref.sgd->zero_grad(true);
      // The average of what the ranks use: a's gradient is the same everywhere; b's is rank 0's over W
      // when only rank 0 uses it, the mean of (1 + r) when all do.
      Tensor loss = sum(mul(ref.params[0], ref.params[0]));
      if (b_anywhere) {
        const double coef = b_here_only_rank0 ? 1.0 / W : (1.0 + (W - 1) / 2.0);
        loss = add(loss, sum(mul(ref.params[1], scalar_like(ref.params[1], coef))));
      }
      backward(loss);
      ref.sgd->step();
    };
    const bool use_b[4] = {true, false, false, me == 0};
    for (int step = 0; step < 4; ++step) {
      opt.backward_and_update(loss_of(got, me, use_b[step]));
      reference_step(step == 0 || step == 3, step == 3);
      const Values g = host_values(got.params), r = host_values(ref.params);
      for (size_t p = 0; p < 2; ++p)
        for (size_t j = 0; j < g[p].size(); ++j)
          CHECK_OR_REPORT(std::fabs(g[p][j] - r[p][j]) <= 1e-6 * (1.0 + std::fabs(r[p][j])),
                          "%s, step %d: parameter %zu[%zu] is %.9g, the plain optimizer's %.9g", what.c_str(),
                          step + 1, p, j, g[p][j], r[p][j]);
    }
    // And b did not move in steps 2 and 3 (the plain optimizer's b is the reference above; this says it of
    // the run itself): its value after step 3 equals that after step 1, checked through a fresh run.
    Model again = make_model();
    dist::DistOpt opt2(again.sgd, comm, o);
    opt2.backward_and_update(loss_of(again, me, true));
    const Values after1 = host_values(again.params);
    opt2.backward_and_update(loss_of(again, me, false));
    opt2.backward_and_update(loss_of(again, me, false));
    const Values after3 = host_values(again.params);
    for (size_t j = 0; j < after1[1].size(); ++j)
      CHECK_OR_REPORT(after3[1][j] == after1[1][j], "%s: unused b[%zu] moved from %.9g to %.9g", what.c_str(), j,
                      after1[1][j], after3[1][j]);
  }
}

}  // namespace distopt_worker
