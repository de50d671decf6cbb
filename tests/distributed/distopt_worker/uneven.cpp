// Uneven inputs: rank r has 2 + 2r batches. Every step's update must be the average over the ranks that
// still have a batch, the ranks that ran out keep taking part (join) without hanging, and every rank
// ends with the same parameters.
#include <cmath>
#include <cstdio>

#include "tandem/ops.h"
#include "worker_util.h"

namespace distopt_worker {

namespace {

int batches_of(int rank) { return 2 + 2 * rank; }

// Rank r's gradient of element j of parameter i at step k.
float grad_at(int r, int k, size_t i, int64_t j) {
  return static_cast<float>(0.25 * (r + 1) + 0.0625 * k - 0.03125 * static_cast<double>(i) +
                            0.001 * static_cast<double>(j % 7));
}

}  // namespace

void scenario_uneven(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const std::vector<int64_t> sizes = {300, 41, 256};
  struct Mode {
    const char* method;
    dist::Shard shard;
    double unit;    // rounding of one value on the wire
    int micro = 1;  // micro-batches a step (each half the gradient)
  };
  for (const Mode& mode : {Mode{"plain", dist::Shard::none, kF32Eps}, Mode{"half", dist::Shard::none, kF16Unit},
                           Mode{"plain", dist::Shard::optimizer, kF32Eps},
                           Mode{"plain", dist::Shard::gradients, kF32Eps},
                           Mode{"plain", dist::Shard::none, kF32Eps, 2},
                           Mode{"plain", dist::Shard::gradients, kF32Eps, 2}}) {
    dist::DistOptOptions o = small_buckets();
    o.sync.method = mode.method;
    o.shard = mode.shard;
    o.uneven_inputs = true;
    Fixture f = make_fixture(comm, sizes, o);
    for (int k = 0; k < batches_of(me); ++k)
      for (int m = 0; m < mode.micro; ++m) {
        Tensor loss = known_loss(f.params, me, [&](int r, size_t i, int64_t j) {
          return grad_at(r, k, i, j) / static_cast<float>(mode.micro);
        });
        if (m + 1 < mode.micro) {
          auto local_only = f.opt->no_sync();
          f.opt->backward_and_sync(loss);
        } else {
          f.opt->step(loss);
        }
      }
    const int64_t shadowed = f.opt->join();
    const int steps = batches_of(W - 1);
    CHECK_OR_REPORT(shadowed == steps - batches_of(me), "%s: rank %d took part in %lld steps of the others, expected %d",
                    mode.method, me, static_cast<long long>(shadowed), steps - batches_of(me));
    // SGD at rate 1 from zeros: each parameter is minus the sum over steps of the active ranks' average.
    Values expected = tabulate(sizes, [&](size_t i, int64_t j) {
      double total = 0;
      for (int k = 0; k < steps; ++k) {
        double sum = 0;
        int active = 0;
        for (int r = 0; r < W; ++r)
          if (k < batches_of(r)) {
            sum += grad_at(r, k, i, j);
            ++active;
          }
        total -= sum / active;
      }
      return total;
    });
    Values tol = tabulate(sizes, [&](size_t i, int64_t j) {
      return 8 * mode.unit * steps * (std::fabs(expected[i][j]) + 1);
    });
    expect_near(strf("%s --shard %s, %d micro-batches, with uneven inputs", mode.method, dist::shard_name(mode.shard),
                     mode.micro),
                host_values(f.params), expected, tol);
    try {
      f.opt->check_consistency();
    } catch (const std::exception& e) {
      CHECK_OR_REPORT(false, "%s --shard %s: the ranks' parameters differ after join: %s", mode.method,
                      dist::shard_name(mode.shard), e.what());
    }
    // The next epoch starts with every rank active again.
    f.opt->step(known_loss(f.params, me, [](int, size_t, int64_t) { return 1.0f; }));
    CHECK_OR_REPORT(f.opt->join() == 0, "a join after an even epoch took part in steps");
  }
  // Without uneven_inputs, join() says what is missing instead of leaving the others to hang.
  Fixture plain = make_fixture(comm, sizes, small_buckets());
  expect_error("join without uneven_inputs", me, [&] { plain.opt->join(); }, {"uneven_inputs"});
}

}  // namespace distopt_worker
