// Sharded state (ZeRO stages 1, 2 and 3): every stage against the unsharded run of the same steps, the
// memory each keeps against the ZeRO formulas, the bytes each sends, and the settings it refuses.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tandem/autograd.h"
#include "tandem/device.h"
#include "tandem/distributed/sharded_layer.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"
#include "tandem/random.h"
#include "worker_util.h"

namespace distopt_worker {

namespace {

// A two-layer perceptron's parameters: w1 [8, 33], b1 [33], w2 [33, 5], b2 [5] (467 values). Under
// 1 KiB buckets they fill three buckets whose sizes no world size of 2 or 3 divides, so that blocks
// are padded and cut parameters in the middle.
std::vector<Tensor> mlp_params(uint64_t seed) {
  Generator gen(seed);
  std::vector<Tensor> ps = {Tensor::normal({8, 33}, 0.0, 0.4, gen, DType::f32, g_device),
                            Tensor::normal({33}, 0.0, 0.1, gen, DType::f32, g_device),
                            Tensor::normal({33, 5}, 0.0, 0.4, gen, DType::f32, g_device),
                            Tensor::normal({5}, 0.0, 0.1, gen, DType::f32, g_device)};
  for (Tensor& p : ps) p.requires_grad_();
  return ps;
}

// Rank `rank`'s micro-batch `micro` of step `step`: its own data, so that the ranks' gradients differ.
Tensor mlp_loss(const std::vector<Tensor>& p, int rank, int step, int micro) {
  Generator gen(7919 * static_cast<uint64_t>(rank) + 131 * static_cast<uint64_t>(step) + static_cast<uint64_t>(micro));
  Tensor x = Tensor::normal({6, 8}, 0.0, 1.0, gen, DType::f32, g_device);
  Tensor y = Tensor::normal({6, 5}, 0.0, 1.0, gen, DType::f32, g_device);
  Tensor h = tanh(bias_add(matmul(x, p[0]), p[1]));
  return mse_loss(bias_add(matmul(h, p[2]), p[3]), y);
}

enum class Kind { sgd, adamw, rmsprop, adagrad };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::sgd: return "sgd-momentum";
    case Kind::adamw: return "adamw";
    case Kind::rmsprop: return "rmsprop";
    case Kind::adagrad: return "adagrad";
  }
  return "?";
}

// AdamW decays the matrices only (a group of its own, the vectors in the other), as GPT training does.
std::shared_ptr<optim::Optimizer> make_opt(Kind k, const std::vector<Tensor>& p) {
  switch (k) {
    case Kind::sgd: {
      optim::SgdOptions o;
      o.lr = 0.05;
      o.momentum = 0.9;
      o.weight_decay = 1e-3;
      o.nesterov = true;
      return std::make_shared<optim::SGD>(p, o);
    }
    case Kind::adamw: {
      optim::AdamOptions o;
      o.lr = 0.01;
      o.weight_decay = 0.1;
      o.decoupled = true;
      std::vector<optim::ParamGroup> groups(2);
      for (const Tensor& t : p) groups[t.dim() >= 2 ? 0 : 1].params.push_back(t);
      groups[1].weight_decay = 0.0;
      return std::make_shared<optim::Adam>(std::move(groups), o);
    }
    case Kind::rmsprop: {
      optim::RmsPropOptions o;
      o.lr = 0.01;
      o.weight_decay = 1e-3;
      return std::make_shared<optim::RMSProp>(p, o);
    }
    case Kind::adagrad: {
      optim::AdagradOptions o;
      o.lr = 0.05;
      o.lr_decay = 0.01;
      return std::make_shared<optim::AdaGrad>(p, o);
    }
  }
  return nullptr;
}

struct Case {
  Kind kind = Kind::sgd;
  std::string method = "plain";
  double clip = 0.0;  // clip_grad_norm's bound; 0: none
  int micro = 1;      // micro-batches per step
  int nan_step = -1;  // with skip_nonfinite: the step whose gradients the last rank makes NaN
  DType masters = DType::f32;  // DistOptOptions::master_weights
};

std::string describe(const Case& c) {
  std::string s = std::string(kind_name(c.kind)) + " " + c.method;
  if (c.clip > 0) s += " clip " + strf("%g", c.clip);
  if (c.micro > 1) s += strf(" %d micro-batches", c.micro);
  if (c.nan_step >= 0) s += strf(" NaN at step %d", c.nan_step);
  if (c.masters != DType::f32) s += std::string(" master weights (") + dtype_name(c.masters) + " parameters)";
  return s;
}

struct Run {
  Values params;
  int64_t clipped = 0;       // steps whose norm was above the bound
  int64_t skipped = 0;       // steps update() skipped
  int64_t state_numel = 0;   // elements of optimizer state this rank holds
  dist::CommStats stats;     // of the last step
  std::vector<dist::BucketInfo> buckets;  // the layout the last step ran with
};

// 20 steps of the case from the same parameters on every rank.
Run run_steps(const std::shared_ptr<dist::Communicator>& comm, dist::Shard shard, const Case& c, int steps = 20) {
  std::vector<Tensor> params = mlp_params(42);
  dist::DistOptOptions o = small_buckets();
  o.shard = shard;
  o.sync.method = c.method;
  o.skip_nonfinite = c.nan_step >= 0;
  dist::DistOpt opt(make_opt(c.kind, params), comm, o);
  Run r;
  for (int s = 0; s < steps; ++s) {
    if (s + 1 == steps) opt.reset_stats();
    for (int m = 0; m < c.micro; ++m) {
      Tensor loss = scale(mlp_loss(params, comm->rank(), s, m), 1.0 / c.micro);
      if (s == c.nan_step && comm->rank() == comm->size() - 1) loss = scale(loss, std::nan(""));
      if (m + 1 < c.micro) {
        auto local_only = opt.no_sync();
        opt.backward_and_sync(loss);
      } else {
        opt.backward_and_sync(loss);
      }
    }
    if (c.clip > 0) r.clipped += opt.clip_grad_norm(c.clip).item<float>() > c.clip;
    r.skipped += !opt.update();
  }
  r.stats = opt.stats();
  r.buckets = opt.bucket_layout();
  r.params = host_values(params);
  for (auto& list : opt.stepping_optimizer().state_lists())
    for (const Tensor& t : *list.tensors) r.state_numel += t.defined() ? t.numel() : 0;
  try {
    opt.check_consistency();
  } catch (const std::exception& e) {
    CHECK_OR_REPORT(false, "%s --shard %s: the ranks' parameters differ: %s", describe(c).c_str(),
                    dist::shard_name(shard), e.what());
  }
  return r;
}

bool bit_identical(const Values& a, const Values& b) {
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j)
      if (std::memcmp(&a[i][j], &b[i][j], sizeof(double)) != 0) return false;
  return true;
}

}  // namespace

void scenario_shard_equal(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size();
  const std::vector<Case> cases = {
      {Kind::sgd, "plain", 0.0, 1},      {Kind::adamw, "plain", 0.0, 1},  {Kind::sgd, "plain", 0.05, 1},
      {Kind::adamw, "plain", 0.05, 1},   {Kind::sgd, "plain", 0.0, 2},    {Kind::adamw, "plain", 0.0, 2},
      {Kind::sgd, "half", 0.0, 1},       {Kind::rmsprop, "plain", 0.0, 1}, {Kind::adagrad, "plain", 0.0, 1},
      {Kind::adamw, "plain", 0.0, 1, 4}, {Kind::sgd, "half", 0.0, 1, 0}};
  for (const Case& c : cases) {
    Run ref = run_steps(comm, dist::Shard::none, c);
    if (c.clip > 0) CHECK_OR_REPORT(ref.clipped > 0, "%s: the bound never clipped", describe(c).c_str());
    if (c.nan_step >= 0) CHECK_OR_REPORT(ref.skipped == 1, "%s: %lld steps skipped", describe(c).c_str(),
                                         static_cast<long long>(ref.skipped));
    for (dist::Shard shard : {dist::Shard::optimizer, dist::Shard::gradients}) {
      Run got = run_steps(comm, shard, c);
      CHECK_OR_REPORT(got.skipped == ref.skipped, "%s --shard %s: %lld steps skipped, %lld unsharded", describe(c).c_str(),
                      dist::shard_name(shard), static_cast<long long>(got.skipped), static_cast<long long>(ref.skipped));
      const std::string what = describe(c) + " --shard " + dist::shard_name(shard) + strf(" on %d ranks", W);
      // Two ranks add two values in either order alike, and every update rule is element-wise: the
      // sharded run repeats the unsharded one bit for bit, except where the sums themselves are
      // taken in another order (the norm from the ranks' blocks; micro-batches averaged one by one).
      const bool same_order = W == 2 && c.clip == 0 && !(shard == dist::Shard::gradients && c.micro > 1);
      if (same_order)
        CHECK_OR_REPORT(bit_identical(got.params, ref.params), "%s: not bit-identical to --shard none", what.c_str());
      // 16-bit sums of three ranks may round in another order: f16 units of the gradients, not f32's.
      const double rel = c.method == "half" && W > 2 ? 1e-3 : 1e-6;
      expect_close_models(what + " vs --shard none", got.params, ref.params, rel);
      // The optimizer's state covers this rank's blocks only: over the ranks, every element once.
      Tensor total = Tensor::from_vector<int64_t>({got.state_numel}, {1}).to(g_device);
      comm->all_reduce(total, dist::ReduceOp::Sum)->wait();
      CHECK_OR_REPORT(total.cpu().to_vector<int64_t>()[0] == ref.state_numel,
                      "%s: %lld elements of optimizer state on this rank, %lld over all ranks, %lld unsharded",
                      what.c_str(), static_cast<long long>(got.state_numel),
                      static_cast<long long>(total.cpu().to_vector<int64_t>()[0]), static_cast<long long>(ref.state_numel));
    }
  }
}

// Clipping left to the step (clip_grad_norm_in_update: the slices' Adam reads the coefficient with each
// gradient) gives the parameters of clipping first, bit for bit, under every stage but sharded parameters;
// the 16-bit copies DistOpt keeps (the ones SGD and AdamW write as they step, or, on more than one rank, the
// sharded step's conversion after its gather) are the parameters' rounding after every step, also under bf16
// master weights (where the parameters hold bf16 values and the copies are those values, which sharded steps
// all-gather).
void scenario_shard_fold(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size();
  for (DType masters : {DType::f32, DType::bf16})
    for (Kind kind : {Kind::adamw, Kind::sgd})
      for (dist::Shard shard : {dist::Shard::none, dist::Shard::optimizer, dist::Shard::gradients}) {
        const std::string what = std::string(kind_name(kind)) + " --shard " + dist::shard_name(shard) +
                                 (masters == DType::f32 ? "" : " --master-weights bf16") + strf(" on %d ranks", W);
        Values runs[2];
        for (int folded = 0; folded < 2; ++folded) {
          std::vector<Tensor> params = mlp_params(42);
          dist::DistOptOptions o = small_buckets();
          o.shard = shard;
          o.master_weights = masters;
          dist::DistOpt opt(make_opt(kind, params), comm, o);
          std::vector<Tensor> copies;
          if (folded) {
            copies = opt.keep_parameter_copies(DType::bf16);
            CHECK_OR_REPORT(copies.size() == params.size(), "%s: keep_parameter_copies gave %zu copies for %zu parameters",
                            what.c_str(), copies.size(), params.size());
          }
          int64_t clipped = 0;
          for (int s = 0; s < 12; ++s) {
            opt.backward_and_sync(mlp_loss(params, comm->rank(), s, 0));
            const float norm = (folded ? opt.clip_grad_norm_in_update(0.05) : opt.clip_grad_norm(0.05)).item<float>();
            clipped += norm > 0.05f;
            opt.update();
            const std::vector<Tensor>& order = opt.optimizer().params();  // the copies' order (AdamW's groups)
            for (size_t i = 0; i < copies.size(); ++i) {
              const std::vector<float> want = order[i].detach().to(DType::bf16).to(DType::f32).cpu().to_vector<float>();
              const std::vector<float> got = copies[i].to(DType::f32).cpu().to_vector<float>();
              CHECK_OR_REPORT(got == want, "%s: step %d: the bf16 copy of parameter %zu is not the parameter's rounding",
                              what.c_str(), s, i);
              if (masters != DType::f32)
                CHECK_OR_REPORT(order[i].detach().cpu().to_vector<float>() == want,
                                "%s: step %d: parameter %zu holds values bf16 does not", what.c_str(), s, i);
            }
          }
          CHECK_OR_REPORT(clipped > 0, "%s: the bound never clipped", what.c_str());
          runs[folded] = host_values(params);
          // An average of the parameters moves their copies with them (each rank's parameters moved apart first,
          // past the optimizer: the average is then none of them; one rank has nothing to average).
          if (folded && masters == DType::f32 && W > 1) {
            for (Tensor& p : params) {
              std::vector<float> v = p.detach().cpu().to_vector<float>();
              for (float& x : v) x += 0.01f * static_cast<float>(comm->rank() + 1);
              p.detach().copy_(Tensor::from_vector<float>(v, p.shape()).to(p.device()));
            }
            opt.average_parameters();
            const std::vector<Tensor>& order = opt.optimizer().params();
            for (size_t i = 0; i < copies.size(); ++i)
              CHECK_OR_REPORT(copies[i].to(DType::f32).cpu().to_vector<float>() ==
                                  order[i].detach().to(DType::bf16).to(DType::f32).cpu().to_vector<float>(),
                              "%s: after average_parameters the bf16 copy of parameter %zu is not the parameter's rounding",
                              what.c_str(), i);
          }
          if (folded && shard == dist::Shard::none && masters == DType::f32)  // its averages would leave the copies stale
            expect_error("partialUpdate after keep_parameter_copies", comm->rank(),
                         [&] { opt.backward_and_partial_update(mlp_loss(params, comm->rank(), 99, 0)); },
                         {"partialUpdate", "keep_parameter_copies"});
        }
        CHECK_OR_REPORT(bit_identical(runs[1], runs[0]),
                        "%s: clipping in the step did not give the parameters of clipping first", what.c_str());
      }
}

// The bytes each stage keeps, reported and measured through the allocator, against the ZeRO formulas
// for Adam in f32 with psi parameters on N ranks: 16 psi (none), 8 psi + 8 psi / N (optimizer),
// 4 psi + 12 psi / N (gradients).
void scenario_shard_memory(const std::shared_ptr<dist::Communicator>& comm) {
  const double N = comm->size();
  // About 240,000 parameters: every tensor stays under the allocator's 1 MiB size class, whose
  // rounding (to 2 MiB) would swamp the measurement.
  const std::vector<int64_t> sizes = {120001, 70003, 49999, 7};
  double psi = 0;
  for (int64_t n : sizes) psi += static_cast<double>(n);
  for (dist::Shard shard : {dist::Shard::none, dist::Shard::optimizer, dist::Shard::gradients}) {
    synchronize(g_device);
    const int64_t before = static_cast<int64_t>(memory_stats(g_device).in_use);
    dist::MemoryReport report;
    int64_t measured = 0;
    {
      std::vector<Tensor> params;
      for (int64_t n : sizes) params.push_back(Tensor::zeros({n}, DType::f32, g_device).requires_grad_());
      optim::AdamOptions ao;
      ao.lr = 1e-3;
      dist::DistOptOptions o;
      o.shard = shard;
      dist::DistOpt opt(std::make_shared<optim::Adam>(params, ao), comm, o);
      report = opt.memory_report();
      for (int s = 0; s < 2; ++s)
        opt.step(known_loss(params, comm->rank(), [](int r, size_t i, int64_t j) { return 0.001f * (r + 1) * (i + 1) + 1e-6f * (j % 97); }));
      synchronize(g_device);
      measured = static_cast<int64_t>(memory_stats(g_device).in_use) - before;
    }
    const double formula = shard == dist::Shard::none        ? 16 * psi
                           : shard == dist::Shard::optimizer ? 8 * psi + 8 * psi / N
                                                             : 4 * psi + 12 * psi / N;
    const double grads = shard == dist::Shard::gradients ? 4 * psi / N : 4 * psi;
    const double state = shard == dist::Shard::none ? 8 * psi : 8 * psi / N;
    std::printf("rank %d: --shard %s on %g ranks: reported %lld bytes (parameters %lld, gradients %lld, optimizer "
                "%lld, master %lld), measured %lld, formula %.0f\n",
                comm->rank(), dist::shard_name(shard), N, static_cast<long long>(report.total()),
                static_cast<long long>(report.parameters), static_cast<long long>(report.gradients),
                static_cast<long long>(report.optimizer_state), static_cast<long long>(report.master_weights),
                static_cast<long long>(measured), formula);
    auto within = [](double got, double want) { return std::fabs(got - want) <= 0.05 * want; };
    CHECK_OR_REPORT(within(static_cast<double>(report.total()), formula), "--shard %s: reported %lld bytes, formula %.0f",
                    dist::shard_name(shard), static_cast<long long>(report.total()), formula);
    CHECK_OR_REPORT(within(static_cast<double>(measured), formula), "--shard %s: the allocator holds %lld bytes more, formula %.0f",
                    dist::shard_name(shard), static_cast<long long>(measured), formula);
    CHECK_OR_REPORT(within(static_cast<double>(report.parameters), 4 * psi), "--shard %s: %lld bytes of parameters",
                    dist::shard_name(shard), static_cast<long long>(report.parameters));
    CHECK_OR_REPORT(within(static_cast<double>(report.gradients), grads), "--shard %s: %lld bytes of gradients, expected %.0f",
                    dist::shard_name(shard), static_cast<long long>(report.gradients), grads);
    CHECK_OR_REPORT(within(static_cast<double>(report.optimizer_state), state),
                    "--shard %s: %lld bytes of optimizer state, expected %.0f", dist::shard_name(shard),
                    static_cast<long long>(report.optimizer_state), state);
    CHECK_OR_REPORT(report.master_weights == 0, "f32 parameters have no master weights");
  }
}

// Bytes sent per step: a reduce-scatter and an all-gather of every (padded) bucket, (N - 1) / N of it
// each, which is an all-reduce's 2 (N - 1) / N.
void scenario_shard_traffic(const std::shared_ptr<dist::Communicator>& comm) {
  const int64_t W = comm->size();
  const Case c{Kind::adamw, "plain", 0.0, 1};
  Run plain = run_steps(comm, dist::Shard::none, c, 3);
  int64_t plain_expected = 0;
  for (const dist::BucketInfo& b : plain.buckets) {
    plain_expected += 4 * b.numel * 2 * (W - 1) / W;
  }
  plain_expected += usage_wire(static_cast<int64_t>(plain.params.size()), W);
  CHECK_OR_REPORT(plain.stats.bytes_sent == plain_expected, "plain sent %lld bytes per step, expected %lld",
                  static_cast<long long>(plain.stats.bytes_sent), static_cast<long long>(plain_expected));
  const int64_t sizes[] = {8 * 33, 33, 33 * 5, 5};  // mlp_params'
  for (dist::Shard shard : {dist::Shard::optimizer, dist::Shard::gradients}) {
    Run got = run_steps(comm, shard, c, 3);
    int64_t expected = 0, padding = 0;
    for (const dist::BucketInfo& b : got.buckets) {
      // Whole blocks of 16-byte units, one per rank; each parameter at a 16-byte boundary.
      CHECK_OR_REPORT(b.span % (4 * W) == 0 && b.span >= b.numel && b.span - b.numel < 4 * W,
                      "--shard %s: a bucket of %lld values spans %lld", dist::shard_name(shard),
                      static_cast<long long>(b.numel), static_cast<long long>(b.span));
      int64_t values = 0;
      for (size_t j = 0; j < b.params.size(); ++j) {
        CHECK_OR_REPORT(b.offsets[j] % 4 == 0, "--shard %s: parameter %d starts at element %lld",
                        dist::shard_name(shard), b.params[j], static_cast<long long>(b.offsets[j]));
        values += sizes[b.params[j]];
      }
      expected += 2 * (4 * b.span * (W - 1) / W);
      padding += b.span - values;
    }
    expected += usage_wire(static_cast<int64_t>(got.params.size()), W);
    std::printf("rank %d: --shard %s on %lld ranks: %lld bytes sent per step, plain %lld (%lld padding values)\n",
                comm->rank(), dist::shard_name(shard), static_cast<long long>(W),
                static_cast<long long>(got.stats.bytes_sent), static_cast<long long>(plain.stats.bytes_sent),
                static_cast<long long>(padding));
    CHECK_OR_REPORT(got.stats.bytes_sent == expected, "--shard %s: %lld bytes sent per step, expected %lld",
                    dist::shard_name(shard), static_cast<long long>(got.stats.bytes_sent),
                    static_cast<long long>(expected));
    // The padding (fewer than N values a bucket) is all that differs from plain.
    const int64_t slack = 8 * padding + 8 * static_cast<int64_t>(got.buckets.size() + plain.buckets.size());
    CHECK_OR_REPORT(std::llabs(got.stats.bytes_sent - plain.stats.bytes_sent) <= slack,
                    "--shard %s sends %lld bytes per step, plain %lld", dist::shard_name(shard),
                    static_cast<long long>(got.stats.bytes_sent), static_cast<long long>(plain.stats.bytes_sent));
    // A reduce-scatter and an all-gather a bucket, and the agreement on the parameters used; a job of one rank
    // exchanges nothing.
    CHECK_OR_REPORT(got.stats.collectives == (W > 1 ? 2 * static_cast<int64_t>(got.buckets.size()) + 1 : 0),
                    "--shard %s: %lld collectives per step for %zu buckets", dist::shard_name(shard),
                    static_cast<long long>(got.stats.collectives), got.buckets.size());
  }
}

void scenario_shard_refusals(const std::shared_ptr<dist::Communicator>& comm) {
  const int me = comm->rank();
  for (const char* method : {"sparseTopK", "sparseThreshold", "powerSGD", "partialUpdate"}) {
    expect_error(strf("-d %s with --shard optimizer", method), me,
                 [&] {
                   std::vector<Tensor> params = mlp_params(3);
                   dist::DistOptOptions o = small_buckets();
                   o.shard = dist::Shard::optimizer;
                   o.sync.method = method;
                   dist::DistOpt opt(make_opt(Kind::sgd, params), comm, o);
                 },
                 {method, "--shard optimizer", "plain"});
  }
  // A step's own method may not be one that cannot shard either.
  std::vector<Tensor> params = mlp_params(3);
  dist::DistOptOptions o = small_buckets();
  o.shard = dist::Shard::gradients;
  dist::DistOpt opt(make_opt(Kind::sgd, params), comm, o);
  expect_error("backward_and_sparse_update under --shard gradients", me,
               [&] { opt.backward_and_sparse_update(mlp_loss(params, me, 0, 0), 0.1, true); },
               {"sparseTopK", "--shard gradients"});
  expect_error("parse_shard", me, [] { dist::parse_shard("stage4"); }, {"stage4", "optimizer", "gradients"});
  CHECK_OR_REPORT(dist::parse_shard("1") == dist::Shard::optimizer && dist::parse_shard("Gradients") == dist::Shard::gradients,
                  "parse_shard does not read stage numbers or another case");
}

}  // namespace distopt_worker

// ---- sharded parameters (stage 3)

namespace distopt_worker {

namespace {

// linear 8->33 and relu, linear 33->17, relu, linear 17->5; with `wrap`, the blocks with parameters
// are ShardedLayers (the parameters' names do not change).
std::shared_ptr<nn::Sequential> layered(uint64_t seed, bool wrap) {
  Generator gen(seed);
  auto group = [&](nn::ModulePtr m) -> nn::ModulePtr {
    return wrap ? std::make_shared<dist::ShardedLayer>(std::move(m)) : m;
  };
  auto first = std::make_shared<nn::Sequential>();
  first->add(std::make_shared<nn::Linear>(8, 33, gen));
  first->add(std::make_shared<nn::ReLU>());
  auto model = std::make_shared<nn::Sequential>();
  model->add(group(first));
  model->add(group(std::make_shared<nn::Linear>(33, 17, gen)));
  model->add(std::make_shared<nn::ReLU>());
  model->add(group(std::make_shared<nn::Linear>(17, 5, gen)));
  model->to(g_device);
  return model;
}

Tensor layered_loss(nn::Module& m, int rank, int step, int micro) {
  Generator gen(7919 * static_cast<uint64_t>(rank) + 131 * static_cast<uint64_t>(step) + static_cast<uint64_t>(micro));
  Tensor x = Tensor::normal({6, 8}, 0.0, 1.0, gen, DType::f32, g_device);
  Tensor y = Tensor::normal({6, 5}, 0.0, 1.0, gen, DType::f32, g_device);
  return mse_loss(m.forward(x), y);
}

struct LayeredRun {
  Values params;
  Values eval;            // the model's output on a fixed input after the steps, without gradients
  Values masters;         // master weights, gathered whole (empty without them)
  dist::CommStats stats;  // of the last step
  std::vector<dist::BucketInfo> buckets;
  dist::MemoryReport report;
  int64_t master_numel = 0;  // elements of master weights this rank keeps
};

LayeredRun run_layered(const std::shared_ptr<dist::Communicator>& comm, dist::Shard shard, const Case& c, int steps,
                       bool overlap = false) {
  auto model = layered(17, shard == dist::Shard::parameters || overlap);
  dist::DistOptOptions o = small_buckets();
  o.shard = shard;
  o.overlap_gather = overlap;
  o.sync.method = c.method;
  o.master_weights = c.masters;
  dist::DistOpt opt(make_opt(c.kind, model->parameters()), comm, o);
  opt.sync_parameters(*model);
  LayeredRun r;
  for (int s = 0; s < steps; ++s) {
    if (s + 1 == steps) opt.reset_stats();
    for (int m = 0; m < c.micro; ++m) {
      Tensor loss = scale(layered_loss(*model, comm->rank(), s, m), 1.0 / c.micro);
      if (m + 1 < c.micro) {
        auto local_only = opt.no_sync();
        opt.backward_and_sync(loss);
      } else {
        opt.backward_and_sync(loss);
      }
    }
    if (c.clip > 0) opt.clip_grad_norm(c.clip);
    opt.update();
  }
  r.stats = opt.stats();
  r.buckets = opt.bucket_layout();
  {
    NoGradGuard no_grad;
    Generator gen(5);
    r.eval = host_values({model->forward(Tensor::normal({3, 8}, 0.0, 1.0, gen, DType::f32, g_device))});
  }
  r.report = opt.memory_report();
  for (auto& list : opt.stepping_optimizer().all_state_lists())
    if (list.kind == "master")
      for (const Tensor& t : *list.tensors) r.master_numel += t.defined() ? t.numel() : 0;
  opt.gather_optimizer_state();  // the parameters too, whole, to be read here
  r.params = host_values(model->parameters());
  for (auto& list : opt.optimizer().all_state_lists())
    if (list.kind == "master") r.masters = host_values(*list.tensors);
  try {
    opt.check_consistency();
  } catch (const std::exception& e) {
    CHECK_OR_REPORT(false, "%s --shard %s: the ranks' parameters differ: %s", describe(c).c_str(),
                    dist::shard_name(shard), e.what());
  }
  return r;
}

}  // namespace

// Stages 1 and 2 with their all-gathers overlapping the next forward (overlap_gather, the model in
// ShardedLayer groups): the parameters of the same stage without overlap, bit for bit (the same sums; only
// when each arrives differs), and of the unsharded run as scenario_shard_equal finds them; the settings it
// refuses.
void scenario_shard_overlap(const std::shared_ptr<dist::Communicator>& comm) {
  const int64_t W = comm->size();
  const std::vector<Case> cases = {{Kind::sgd, "plain", 0.0, 1},       {Kind::adamw, "plain", 0.0, 1},
                                   {Kind::adamw, "plain", 0.05, 1},     {Kind::sgd, "half", 0.0, 1},
                                   {Kind::adamw, "plain", 0.0, 2},      {Kind::adamw, "plain", 0.0, 1, -1, DType::bf16}};
  for (const Case& c : cases) {
    LayeredRun ref = run_layered(comm, dist::Shard::none, c, 20);
    for (dist::Shard shard : {dist::Shard::optimizer, dist::Shard::gradients}) {
      LayeredRun plain = run_layered(comm, shard, c, 20);
      LayeredRun got = run_layered(comm, shard, c, 20, /*overlap=*/true);
      const std::string what = describe(c) + " --shard " + dist::shard_name(shard) +
                               strf(" with overlapped gathers on %lld ranks", static_cast<long long>(W));
      CHECK_OR_REPORT(bit_identical(got.params, plain.params), "%s: not bit-identical to the same stage without overlap",
                      what.c_str());
      CHECK_OR_REPORT(bit_identical(got.eval, plain.eval), "%s: evaluates otherwise than without overlap", what.c_str());
      // As in scenario_shard_equal; 16-bit parameters (master weights) within one unit of their type.
      const double rel = c.masters != DType::f32 ? 1e-2 : c.method == "half" && W > 2 ? 1e-3 : 1e-6;
      expect_close_models(what + " vs --shard none", got.params, ref.params, rel);
      CHECK_OR_REPORT(got.stats.collectives == plain.stats.collectives && got.stats.bytes_sent == plain.stats.bytes_sent,
                      "%s: %lld collectives and %lld bytes a step, %lld and %lld without overlap", what.c_str(),
                      static_cast<long long>(got.stats.collectives), static_cast<long long>(got.stats.bytes_sent),
                      static_cast<long long>(plain.stats.collectives), static_cast<long long>(plain.stats.bytes_sent));
    }
  }
  for (dist::Shard shard : {dist::Shard::none, dist::Shard::parameters})
    expect_error(strf("overlap_gather with --shard %s", dist::shard_name(shard)), static_cast<int>(comm->rank()),
                 [&] {
                   auto model = layered(17, true);
                   dist::DistOptOptions o = small_buckets();
                   o.shard = shard;
                   o.overlap_gather = true;
                   dist::DistOpt opt(make_opt(Kind::sgd, model->parameters()), comm, o);
                 },
                 {"overlap_gather", dist::shard_name(shard)});
}

void scenario_shard_parameters(const std::shared_ptr<dist::Communicator>& comm) {
  const int64_t W = comm->size();
  const std::vector<Case> cases = {{Kind::sgd, "plain", 0.0, 1},  {Kind::adamw, "plain", 0.0, 1},
                                   {Kind::adamw, "plain", 0.05, 1}, {Kind::sgd, "plain", 0.0, 2},
                                   {Kind::sgd, "half", 0.0, 1}};
  for (const Case& c : cases) {
    LayeredRun ref = run_layered(comm, dist::Shard::none, c, 20);
    LayeredRun got = run_layered(comm, dist::Shard::parameters, c, 20);
    const std::string what = describe(c) + strf(" --shard parameters on %lld ranks", static_cast<long long>(W));
    const bool same_order = W == 2 && c.clip == 0 && c.micro == 1;
    if (same_order)
      CHECK_OR_REPORT(bit_identical(got.params, ref.params), "%s: not bit-identical to --shard none", what.c_str());
    const double rel = c.method == "half" && W > 2 ? 1e-3 : 1e-6;  // as in scenario_shard_equal
    expect_close_models(what + " vs --shard none", got.params, ref.params, rel);
    expect_close_models(what + ", evaluated", got.eval, ref.eval, rel);
    if (c.kind != Kind::sgd || c.method != "plain" || c.micro != 1) continue;
    // Traffic: every group gathered for forward and again for backward, and reduce-scattered: 1.5 times
    // an all-reduce (up to the padding of the buckets to whole blocks).
    int64_t expected = 0, plain = 0;
    for (const dist::BucketInfo& b : got.buckets) expected += 3 * (4 * b.span * (W - 1) / W);
    for (const dist::BucketInfo& b : ref.buckets) plain += 4 * b.numel * 2 * (W - 1) / W;
    expected += usage_wire(static_cast<int64_t>(got.params.size()), W);
    plain += usage_wire(static_cast<int64_t>(ref.params.size()), W);
    std::printf("rank %d: --shard parameters on %lld ranks: %lld bytes sent per step, plain %lld (%.3f times)\n",
                comm->rank(), static_cast<long long>(W), static_cast<long long>(got.stats.bytes_sent),
                static_cast<long long>(ref.stats.bytes_sent),
                ref.stats.bytes_sent > 0 ? static_cast<double>(got.stats.bytes_sent) / ref.stats.bytes_sent : 0.0);
    CHECK_OR_REPORT(got.stats.bytes_sent == expected, "--shard parameters: %lld bytes sent per step, expected %lld",
                    static_cast<long long>(got.stats.bytes_sent), static_cast<long long>(expected));
    CHECK_OR_REPORT(ref.stats.bytes_sent == plain, "plain: %lld bytes sent per step, expected %lld",
                    static_cast<long long>(ref.stats.bytes_sent), static_cast<long long>(plain));
    // Beyond 1.5 times plain: the padding (to whole blocks, and to align each parameter), 3 (N-1)/N of 4 bytes a value.
    int64_t padding = 0;
    for (const dist::BucketInfo& b : got.buckets) {
      padding += b.span;
      for (int i : b.params) padding -= static_cast<int64_t>(got.params[static_cast<size_t>(i)].size());
    }
    CHECK_OR_REPORT(got.stats.bytes_sent <= plain * 3 / 2 + 12 * padding,
                    "--shard parameters sends %lld bytes, more than 1.5 times plain's %lld and its padding (%lld values)",
                    static_cast<long long>(got.stats.bytes_sent), static_cast<long long>(plain),
                    static_cast<long long>(padding));
  }
  // gather_parameters / release_parameters: values written into the whole parameters stay with keep (each rank
  // keeps its blocks of them), and are dropped without it.
  {
    auto model = layered(5, true);
    dist::DistOptOptions o = small_buckets();
    o.shard = dist::Shard::parameters;
    dist::DistOpt opt(make_opt(Kind::sgd, model->parameters()), comm, o);
    opt.sync_parameters(*model);
    const std::vector<Tensor> ps = model->parameters();
    auto all_equal = [&](double v) {
      for (const std::vector<double>& p : host_values(ps))
        for (double x : p)
          if (x != v) return false;
      return true;
    };
    CHECK_OR_REPORT(std::isnan(host_values(ps)[0][0]), "--shard parameters: a parameter is whole between steps");
    opt.gather_parameters();
    for (const Tensor& p : ps) p.detach().fill_(0.25);
    opt.release_parameters(/*keep=*/true);
    CHECK_OR_REPORT(std::isnan(host_values(ps)[0][0]), "release_parameters left a parameter whole");
    opt.gather_parameters();
    CHECK_OR_REPORT(all_equal(0.25), "release_parameters(keep) lost the values written into the whole parameters");
    for (const Tensor& p : ps) p.detach().fill_(0.5);
    opt.release_parameters(/*keep=*/false);
    opt.gather_parameters();
    CHECK_OR_REPORT(all_equal(0.25), "release_parameters without keep kept the values written");
    opt.release_parameters(false);
    opt.check_consistency();
  }
  // Every parameter must be in a layer group.
  auto loose = layered(3, false);
  dist::DistOptOptions o = small_buckets();
  o.shard = dist::Shard::parameters;
  dist::DistOpt opt(make_opt(Kind::sgd, loose->parameters()), comm, o);
  expect_error("--shard parameters without ShardedLayers", comm->rank(), [&] { opt.sync_parameters(*loose); },
               {"ShardedLayer"});
}

namespace {

// Three ShardedLayers of linear 256->256 (197,376 parameters) under Adam: the bytes kept between
// steps (reported, and measured through the allocator), and the most a step holds above them.
struct LayerMemory {
  dist::MemoryReport report;
  int64_t kept = 0, step_peak = 0;
  double psi = 0, group_bytes = 0;
};

LayerMemory layer_memory(const std::shared_ptr<dist::Communicator>& comm, dist::Shard shard) {
  LayerMemory r;
  synchronize(g_device);
  const int64_t before = static_cast<int64_t>(memory_stats(g_device).in_use);
  {
    Generator gen(1);
    auto model = std::make_shared<nn::Sequential>();
    for (int l = 0; l < 3; ++l)
      model->add(std::make_shared<dist::ShardedLayer>(std::make_shared<nn::Linear>(256, 256, gen)));
    model->to(g_device);
    for (const Tensor& p : model->parameters()) r.psi += static_cast<double>(p.numel());
    r.group_bytes = 4 * r.psi / 3;
    optim::AdamOptions ao;
    ao.lr = 1e-3;
    dist::DistOptOptions o;
    o.shard = shard;
    dist::DistOpt opt(std::make_shared<optim::Adam>(model->parameters(), ao), comm, o);
    opt.sync_parameters(*model);
    for (int s = 0; s < 3; ++s) {
      Generator data(100 + static_cast<uint64_t>(comm->rank()) + 7 * static_cast<uint64_t>(s));
      Tensor x = Tensor::normal({4, 256}, 0.0, 1.0, data, DType::f32, g_device);
      synchronize(g_device);
      const int64_t at_start = static_cast<int64_t>(memory_stats(g_device).in_use);
      reset_peak_memory(g_device);
      opt.step(mean(mul(model->forward(x), x)));
      synchronize(g_device);
      r.step_peak = static_cast<int64_t>(memory_stats(g_device).peak_in_use) - at_start;
    }
    r.report = opt.memory_report();
    synchronize(g_device);
    r.kept = static_cast<int64_t>(memory_stats(g_device).in_use) - before;
  }
  return r;
}

}  // namespace

// With Adam in f32 a rank keeps 16 psi / N bytes between steps under sharded parameters, and within a
// step holds the groups whole one or two at a time.
void scenario_shard_parameters_memory(const std::shared_ptr<dist::Communicator>& comm) {
  const double N = comm->size();
  const LayerMemory got = layer_memory(comm, dist::Shard::parameters);
  const double formula = 16 * got.psi / N;
  std::printf("rank %d: --shard parameters on %g ranks: reported %lld bytes (parameters %lld, gradients %lld, "
              "optimizer %lld), measured %lld, formula %.0f\n",
              comm->rank(), N, static_cast<long long>(got.report.total()),
              static_cast<long long>(got.report.parameters), static_cast<long long>(got.report.gradients),
              static_cast<long long>(got.report.optimizer_state), static_cast<long long>(got.kept), formula);
  auto within = [](double value, double want) { return std::fabs(value - want) <= 0.05 * want; };
  CHECK_OR_REPORT(within(static_cast<double>(got.report.total()), formula), "reported %lld bytes, formula %.0f",
                  static_cast<long long>(got.report.total()), formula);
  CHECK_OR_REPORT(within(static_cast<double>(got.kept), formula), "the allocator holds %lld bytes more, formula %.0f",
                  static_cast<long long>(got.kept), formula);
  CHECK_OR_REPORT(within(static_cast<double>(got.report.parameters), 4 * got.psi / N), "%lld bytes of parameters",
                  static_cast<long long>(got.report.parameters));
  // The same step with the parameters whole throughout (sharded gradients) holds the same gradients on
  // their way; sharded parameters add at most two whole groups at a time (the one computing, the one
  // prefetched), not the three of the model.
  const LayerMemory whole = layer_memory(comm, dist::Shard::gradients);
  const double extra = static_cast<double>(got.step_peak - whole.step_peak);
  std::printf("rank %d: a step's peak above the kept state: %lld bytes, %lld with whole parameters (a group is %.0f)\n",
              comm->rank(), static_cast<long long>(got.step_peak), static_cast<long long>(whole.step_peak),
              got.group_bytes);
  CHECK_OR_REPORT(extra <= 2.1 * got.group_bytes, "a step with sharded parameters held %.0f bytes more than with "
                  "whole ones: more than two groups of %.0f whole at once", extra, got.group_bytes);
}

}  // namespace distopt_worker

namespace distopt_worker {

namespace {
// Elements of the values that the dtype does not represent exactly.
int64_t unrepresentable(const Values& v, DType dtype) {
  int64_t n = 0;
  for (const auto& p : v) {
    Tensor t = Tensor::from_vector<float>(std::vector<float>(p.begin(), p.end()), {static_cast<int64_t>(p.size())});
    std::vector<float> back = t.to(dtype).to(DType::f32).to_vector<float>();
    for (size_t j = 0; j < p.size(); ++j) n += static_cast<double>(back[j]) != p[j];
  }
  return n;
}
}  // namespace

// Master weights (16-bit parameters, f32 masters as optimizer state) under every stage: the parameters and
// the masters (gathered) of the unsharded run with masters, bit for bit where the sums are taken in the
// same order; the parameters hold 16-bit values, the masters more; the masters are this rank's blocks alone
// (over the ranks, every element once: 4 bytes a parameter); the parameters are all-gathered in 16 bits; and
// the masters change the result (a run without them ends elsewhere).
void scenario_shard_masters(const std::shared_ptr<dist::Communicator>& comm) {
  const int64_t W = comm->size();
  const std::vector<Case> cases = {
      {Kind::adamw, "plain", 0.0, 1, -1, DType::bf16}, {Kind::sgd, "plain", 0.0, 1, -1, DType::bf16},
      {Kind::adamw, "plain", 0.05, 1, -1, DType::bf16}, {Kind::adamw, "plain", 0.0, 2, -1, DType::bf16},
      {Kind::sgd, "half", 0.0, 1, -1, DType::f16}};
  for (const Case& c : cases) {
    LayeredRun ref = run_layered(comm, dist::Shard::none, c, 20);
    Case without = c;
    without.masters = DType::f32;
    LayeredRun f32 = run_layered(comm, dist::Shard::none, without, 20);
    const std::string name = describe(c) + strf(" on %lld ranks", static_cast<long long>(W));
    CHECK_OR_REPORT(!bit_identical(ref.params, f32.params), "%s: the same parameters as without master weights",
                    name.c_str());
    CHECK_OR_REPORT(unrepresentable(ref.masters, c.masters) > 0, "%s: every master is a %s value", name.c_str(),
                    dtype_name(c.masters));
    CHECK_OR_REPORT(unrepresentable(f32.params, c.masters) > 0, "%s: without masters the parameters are %s values",
                    name.c_str(), dtype_name(c.masters));
    int64_t psi = 0;
    for (const auto& p : ref.params) psi += static_cast<int64_t>(p.size());
    for (dist::Shard shard : {dist::Shard::none, dist::Shard::optimizer, dist::Shard::gradients, dist::Shard::parameters}) {
      LayeredRun got = shard == dist::Shard::none ? ref : run_layered(comm, shard, c, 20);
      const std::string what = name + " --shard " + dist::shard_name(shard);
      CHECK_OR_REPORT(unrepresentable(got.params, c.masters) == 0, "%s: %lld parameters are not %s values", what.c_str(),
                      static_cast<long long>(unrepresentable(got.params, c.masters)), dtype_name(c.masters));
      CHECK_OR_REPORT(got.masters.size() == ref.params.size(), "%s: %zu master weights gathered for %zu parameters",
                      what.c_str(), got.masters.size(), ref.params.size());
      // The masters this rank keeps, reported and counted: over the ranks, every element once.
      CHECK_OR_REPORT(got.report.master_weights == 4 * got.master_numel, "%s: %lld bytes of master weights reported, "
                      "%lld kept", what.c_str(), static_cast<long long>(got.report.master_weights),
                      static_cast<long long>(4 * got.master_numel));
      Tensor total = Tensor::from_vector<int64_t>({got.master_numel}, {1}).to(g_device);
      comm->all_reduce(total, dist::ReduceOp::Sum)->wait();
      const int64_t over_ranks = total.cpu().to_vector<int64_t>()[0];
      CHECK_OR_REPORT(over_ranks == (shard == dist::Shard::none ? W * psi : psi),
                      "%s: %lld master elements over the ranks for %lld parameters", what.c_str(),
                      static_cast<long long>(over_ranks), static_cast<long long>(psi));
      if (shard == dist::Shard::none) continue;
      // The parameters' 16-bit values are gathered in 16 bits: a bucket's f32 gradients reduce-scattered and its
      // 2-byte values all-gathered once (stages 1 and 2) or twice (stage 3: forward and backward), (N-1)/N of
      // each, every bucket padded to whole blocks. Stage 3 then sends what plain sends.
      if (c.method == "plain" && c.clip == 0 && c.micro == 1) {
        const int64_t gathers = shard == dist::Shard::parameters ? 2 : 1;
        int64_t expected = 0;
        for (const dist::BucketInfo& b : got.buckets)
          expected += 4 * b.span * (W - 1) / W + gathers * (2 * b.span * (W - 1) / W);
        expected += usage_wire(static_cast<int64_t>(got.params.size()), W);
        CHECK_OR_REPORT(got.stats.bytes_sent == expected, "%s: %lld bytes sent per step, expected %lld (16-bit "
                        "gathers)", what.c_str(), static_cast<long long>(got.stats.bytes_sent),
                        static_cast<long long>(expected));
      }
      const bool same_order = W == 2 && c.clip == 0 && c.micro == 1;
      if (same_order) {
        CHECK_OR_REPORT(bit_identical(got.params, ref.params), "%s: parameters not bit-identical to --shard none",
                        what.c_str());
        CHECK_OR_REPORT(bit_identical(got.masters, ref.masters), "%s: masters not bit-identical to --shard none",
                        what.c_str());
      }
      // Masters within f32 rounding of the sums' order (16-bit sums of three ranks: f16's); the parameters
      // are their rounding, within one unit of the 16-bit type.
      expect_close_models(what + ": masters vs --shard none", got.masters, ref.masters,
                          c.method == "half" && W > 2 ? 1e-3 : 1e-6);
      expect_close_models(what + ": parameters vs --shard none", got.params, ref.params, 1e-2);
    }
  }
  // An optimizer that keeps master weights already keeps them under DistOpt's default options.
  {
    auto m = layered(17, false);
    auto own = make_opt(Kind::adamw, m->parameters());
    own->keep_master_weights(DType::bf16);
    dist::DistOptOptions d = small_buckets();
    d.shard = dist::Shard::optimizer;
    dist::DistOpt opt(own, comm, d);
    CHECK_OR_REPORT(opt.options().master_weights == DType::bf16 && opt.memory_report().master_weights > 0,
                    "an optimizer's own master weights are dropped by DistOpt (%s, %lld bytes)",
                    dtype_name(opt.options().master_weights), static_cast<long long>(opt.memory_report().master_weights));
  }
  // Not with partialUpdate.
  auto model = layered(17, false);
  dist::DistOptOptions o = small_buckets();
  o.master_weights = DType::bf16;
  o.sync.method = "partialUpdate";
  expect_error("master weights with partialUpdate", comm->rank(),
               [&] { dist::DistOpt opt(make_opt(Kind::sgd, model->parameters()), comm, o); }, {"partialUpdate", "master"});
  o.sync.method = "plain";
  o.master_weights = DType::i64;
  expect_error("master weights of i64", comm->rank(),
               [&] { dist::DistOpt opt(make_opt(Kind::sgd, model->parameters()), comm, o); }, {"bf16", "f16"});
}

}  // namespace distopt_worker
