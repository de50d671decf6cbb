// Parameter groups changed after steps were taken (DistOpt::set_param_groups, or the wrapped optimizer
// regrouped directly, as loading a checkpoint does), against the unsharded run of the same steps and
// regroupings.
#include <cstring>

#include "tandem/ops.h"
#include "tandem/random.h"
#include "worker_util.h"

namespace distopt_worker {

namespace {

// w1 [8, 33], b1 [33], w2 [33, 5], b2 [5]: three 1 KiB buckets, cut mid-parameter on 2 and 3 ranks.
std::vector<Tensor> params_from(uint64_t seed) {
  Generator gen(seed);
  std::vector<Tensor> ps = {Tensor::normal({8, 33}, 0.0, 0.4, gen, DType::f32, g_device),
                            Tensor::normal({33}, 0.0, 0.1, gen, DType::f32, g_device),
                            Tensor::normal({33, 5}, 0.0, 0.4, gen, DType::f32, g_device),
                            Tensor::normal({5}, 0.0, 0.1, gen, DType::f32, g_device)};
  for (Tensor& p : ps) p.requires_grad_();
  return ps;
}

Tensor loss_of(const std::vector<Tensor>& p, int rank, int step) {
  Generator gen(7919 * static_cast<uint64_t>(rank) + 131 * static_cast<uint64_t>(step));
  Tensor x = Tensor::normal({6, 8}, 0.0, 1.0, gen, DType::f32, g_device);
  Tensor y = Tensor::normal({6, 5}, 0.0, 1.0, gen, DType::f32, g_device);
  return mse_loss(bias_add(matmul(tanh(bias_add(matmul(x, p[0]), p[1])), p[2]), p[3]), y);
}

enum class How { dist_opt, wrapped };

// Ten AdamW steps in one group; then the vectors get a group of their own (half the rate, no decay);
// after step 6 the first matrix joins them. The regroupings go through DistOpt, or straight to the
// wrapped optimizer (the next update then cuts the slices again).
Values regrouped_run(const std::shared_ptr<dist::Communicator>& comm, dist::Shard shard, How how, DType masters) {
  std::vector<Tensor> p = params_from(42);
  optim::AdamOptions ao;
  ao.lr = 0.01;
  ao.weight_decay = 0.1;
  ao.decoupled = true;
  auto adam = std::make_shared<optim::Adam>(p, ao);
  dist::DistOptOptions o = small_buckets();
  o.shard = shard;
  o.master_weights = masters;
  dist::DistOpt opt(adam, comm, o);
  auto regroup = [&](std::vector<Tensor> members) {
    std::vector<optim::ParamGroup> groups(1);
    groups[0].params = std::move(members);
    groups[0].lr_scale = 0.5;
    groups[0].weight_decay = 0.0;
    if (how == How::dist_opt)
      opt.set_param_groups(groups);
    else
      adam->set_param_groups(groups);
  };
  for (int s = 0; s < 10; ++s) {
    if (s == 3) regroup({p[1], p[3]});
    if (s == 6) regroup({p[1], p[3], p[0]});
    opt.backward_and_sync(loss_of(p, comm->rank(), s));
    opt.update();
  }
  CHECK_OR_REPORT(adam->groups().size() == 2 && adam->group_of()[0] == 0 && adam->group_of()[2] == 1,
                  "--shard %s: the wrapped optimizer does not hold the last grouping", dist::shard_name(shard));
  try {
    opt.check_consistency();
  } catch (const std::exception& e) {
    CHECK_OR_REPORT(false, "--shard %s: the ranks' parameters differ: %s", dist::shard_name(shard), e.what());
  }
  return host_values(p);
}

bool same_bits(const Values& a, const Values& b) {
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j)
      if (std::memcmp(&a[i][j], &b[i][j], sizeof(double)) != 0) return false;
  return true;
}

}  // namespace

void scenario_shard_regroup(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size();
  for (DType masters : {DType::f32, DType::bf16}) {
    const Values ref = regrouped_run(comm, dist::Shard::none, How::dist_opt, masters);
    for (dist::Shard shard : {dist::Shard::optimizer, dist::Shard::gradients})
      for (How how : {How::dist_opt, How::wrapped}) {
        const std::string what = std::string("regrouped ") + (how == How::dist_opt ? "through DistOpt" : "directly") +
                                 " --shard " + dist::shard_name(shard) +
                                 (masters == DType::f32 ? "" : " --master-weights bf16") + strf(" on %d ranks", W);
        const Values got = regrouped_run(comm, shard, how, masters);
        // Two ranks add two values in either order alike and every update is element-wise: bit for bit.
        if (W == 2) CHECK_OR_REPORT(same_bits(got, ref), "%s: not bit-identical to --shard none", what.c_str());
        expect_close_models(what + " vs --shard none", got, ref, 1e-6);
      }
  }
  // What holds the slices cut along the old groups refuses a new grouping, saying when to give it.
  std::vector<Tensor> p = params_from(5);
  dist::DistOptOptions o = small_buckets();
  o.shard = dist::Shard::optimizer;
  dist::DistOpt opt(std::make_shared<optim::Adam>(p, optim::AdamOptions{}), comm, o);
  if (!opt.keep_parameter_copies(DType::bf16).empty()) {
    std::vector<optim::ParamGroup> groups(1);
    groups[0].params = {p[1]};
    expect_error("regrouped after keep_parameter_copies", comm->rank(), [&] { opt.set_param_groups(groups); },
                 {"keep_parameter_copies", "before"});
    CHECK_OR_REPORT(opt.optimizer().groups().size() == 1, "a refused grouping stayed in the wrapped optimizer");
  }
}

}  // namespace distopt_worker
