// Scenarios on real models: data-parallel steps against the same steps on one rank with the whole
// batch, overlap of communication with backward, and the agreement checks (sync_parameters,
// check_consistency, average_buffers).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tandem/autograd.h"
#include "tandem/distributed/sync_batch_norm.h"
#include "tandem/nn/layers.h"
#include "tandem/ops.h"
#include "tandem/random.h"
#include "worker_util.h"

namespace distopt_worker {

namespace {

using nn::Sequential;

// conv 1->4 3x3, relu, pool 2, linear 36->16, relu, linear 16->10 on 8x8 images: 802 parameters.
std::shared_ptr<Sequential> small_cnn(uint64_t seed) {
  Generator gen(seed);
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<nn::Conv2d>(1, 4, 3, gen));
  m->add(std::make_shared<nn::ReLU>());
  m->add(std::make_shared<nn::MaxPool2d>(2));
  m->add(std::make_shared<nn::Flatten>());
  m->add(std::make_shared<nn::Linear>(36, 16, gen));
  m->add(std::make_shared<nn::ReLU>());
  m->add(std::make_shared<nn::Linear>(16, 10, gen));
  m->to(g_device);
  return m;
}

struct Batch {
  Tensor x, y;
};

// The step's global batch: the same on every rank, drawn from the step number.
Batch global_batch(int step, const Shape& image, int64_t n) {
  Generator gen(1000 + static_cast<uint64_t>(step));
  Shape shape = {n};
  shape.insert(shape.end(), image.begin(), image.end());
  Batch b;
  b.x = Tensor::normal(shape, 0.0, 1.0, gen, DType::f32, g_device);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (auto& l : labels) l = static_cast<int64_t>(gen.next_below(10));
  b.y = Tensor::from_vector(labels, {n}).to(g_device);
  return b;
}

Values model_values(const nn::Module& m) { return host_values(m.parameters()); }

void expect_no_error(const std::string& what, const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    CHECK_OR_REPORT(false, "%s: %s", what.c_str(), e.what());
  }
}

// Overwrites one element of t (on any device).
void poke(Tensor t, int64_t index, double delta) {
  std::vector<float> v = t.detach().cpu().to_vector<float>();
  v[static_cast<size_t>(index)] += static_cast<float>(delta);
  t.copy_(device_tensor(v, t.shape()));
}

}  // namespace

void scenario_equivalence(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const int64_t global = 64, steps = 5;
  CHECK_OR_REPORT(global % W == 0, "equivalence needs a world size that divides %lld", static_cast<long long>(global));
  if (global % W) return;
  const int64_t local = global / W;
  const Shape image = {1, 8, 8};
  optim::SgdOptions so;
  so.lr = 0.05;
  so.momentum = 0.9;
  so.weight_decay = 1e-3;

  // One rank, the whole batch per step: plain SGD, no distributed optimizer involved.
  auto ref_model = small_cnn(7);
  Values initial = model_values(*ref_model);
  optim::SGD ref_opt(ref_model->parameters(), so);
  for (int s = 0; s < steps; ++s) {
    Batch b = global_batch(s, image, global);
    ref_opt.zero_grad();
    backward(softmax_cross_entropy(ref_model->forward(b.x), b.y));
    ref_opt.step();
  }
  Values ref = model_values(*ref_model);

  // W ranks, rows [local*r, local*(r+1)) each, in every mode whose result should match.
  for (std::string mode : {"plain", "half"}) {
    auto model = small_cnn(7);
    dist::DistOptOptions o = small_buckets();
    o.sync.method = mode;
    dist::DistOpt opt(std::make_shared<optim::SGD>(model->parameters(), so), comm, o);
    opt.sync_parameters(*model);
    CHECK_OR_REPORT(opt.bucket_sizes().size() >= 3, "expected several buckets, got %zu", opt.bucket_sizes().size());
    for (int s = 0; s < steps; ++s) {
      Batch b = global_batch(s, image, global);
      Tensor x = b.x.narrow(0, local * me, local), y = b.y.narrow(0, local * me, local);
      opt.step(softmax_cross_entropy(model->forward(x), y));
    }
    Values got = model_values(*model);
    if (mode == "plain") {
      expect_close_models(strf("plain on %d ranks vs 1 rank", W), got, ref, 1e-5);
    } else {
      // Half sends each gradient rounded to f16: compare the distance travelled from the start,
      // allowing a few f16 units of it.
      Values moved_ref = ref, moved_got = got;
      for (size_t i = 0; i < ref.size(); ++i)
        for (size_t j = 0; j < ref[i].size(); ++j) {
          moved_ref[i][j] -= initial[i][j];
          moved_got[i][j] -= initial[i][j];
        }
      expect_close_models(strf("half on %d ranks vs f32 on 1 rank (movement)", W), moved_got, moved_ref,
                          4 * kF16Unit);
    }
    expect_no_error(strf("%s: ranks agree", mode.c_str()), [&] { opt.check_consistency(); });
  }
}

// Gradient accumulation: each rank takes its rows of the global batch as two micro-batches, the
// first under no_sync (no communication), each loss weighted by 1/2; the step must equal one rank
// taking the whole batch at once.
void scenario_accumulate(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const int64_t local = 32, micro = local / 2, global = local * W, steps = 4;
  const Shape image = {1, 8, 8};
  optim::SgdOptions so;
  so.lr = 0.05;
  so.momentum = 0.9;
  so.weight_decay = 1e-3;
  auto ref_model = small_cnn(5);
  optim::SGD ref_opt(ref_model->parameters(), so);
  for (int s = 0; s < steps; ++s) {
    Batch b = global_batch(s, image, global);
    ref_opt.zero_grad();
    backward(softmax_cross_entropy(ref_model->forward(b.x), b.y));
    ref_opt.step();
  }
  auto model = small_cnn(5);
  dist::DistOpt opt(std::make_shared<optim::SGD>(model->parameters(), so), comm, small_buckets());
  opt.sync_parameters(*model);
  for (int s = 0; s < steps; ++s) {
    Batch b = global_batch(s, image, global);
    for (int m = 0; m < 2; ++m) {
      Tensor x = b.x.narrow(0, local * me + micro * m, micro), y = b.y.narrow(0, local * me + micro * m, micro);
      Tensor loss = scale(softmax_cross_entropy(model->forward(x), y), 0.5);
      if (m == 0) {
        const int64_t before = opt.stats().collectives;
        auto local_only = opt.no_sync();
        opt.backward_and_sync(loss);
        CHECK_OR_REPORT(opt.stats().collectives == before, "a micro-batch under no_sync communicated");
      } else {
        opt.backward_and_sync(loss);
        opt.update();
      }
    }
  }
  CHECK_OR_REPORT(opt.stats().steps == steps, "%lld synchronisations for %lld steps",
                  static_cast<long long>(opt.stats().steps), static_cast<long long>(steps));
  expect_close_models(strf("2 micro-batches of %lld on %d ranks vs one batch of %lld", static_cast<long long>(micro),
                           W, static_cast<long long>(global)),
                      model_values(*model), model_values(*ref_model), 1e-5);
  expect_no_error("accumulate: ranks agree", [&] { opt.check_consistency(); });
}

void scenario_overlap(const std::shared_ptr<dist::Communicator>& comm) {
  const int me = comm->rank();
  Generator gen(11);
  auto model = std::make_shared<Sequential>();
  model->add(std::make_shared<nn::Linear>(16, 32, gen));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(32, 32, gen));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(32, 32, gen));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(32, 10, gen));
  model->to(g_device);
  optim::SgdOptions so;
  so.lr = 0.01;
  dist::DistOpt opt(std::make_shared<optim::SGD>(model->parameters(), so), comm, small_buckets());
  opt.sync_parameters(*model);
  opt.set_trace(true);
  struct Step {
    const char* mode;
    std::function<void(const Tensor&)> run;
  };
  const std::vector<Step> plan = {
      {"plain", [&](const Tensor& l) { opt.backward_and_update(l); }},
      {"plain", [&](const Tensor& l) { opt.backward_and_update(l); }},
      {"half", [&](const Tensor& l) { opt.backward_and_update_half(l); }},
      {"sparseTopK", [&](const Tensor& l) { opt.backward_and_sparse_update(l, 0.1, true); }},
      {"sparseThreshold", [&](const Tensor& l) { opt.backward_and_sparse_update(l, 1e-3, false); }}};
  for (size_t s = 0; s < plan.size(); ++s) {
    const size_t buckets = opt.bucket_sizes().size(), start = opt.trace().size();
    CHECK_OR_REPORT(buckets >= 4, "expected several buckets, got %zu", buckets);
    Batch b = global_batch(static_cast<int>(s) * 10 + me, {16}, 8);
    plan[s].run(softmax_cross_entropy(model->forward(b.x), b.y));
    std::vector<std::string> events(opt.trace().begin() + static_cast<std::ptrdiff_t>(start), opt.trace().end());
    const char* mode = plan[s].mode;
    size_t next = 0, launched_before_done = 0, done = 0;
    std::string seen;
    for (const std::string& e : events) {
      seen += e + "; ";
      if (e == "backward_done") {
        ++done;
        continue;
      }
      if (e.rfind("launch ", 0) == 0) {
        size_t k = std::stoul(e.substr(7));
        CHECK_OR_REPORT(k == next, "step %zu (%s): launch %zu came where launch %zu was due: %s", s, mode, k, next,
                        seen.c_str());
        next = k + 1;
        if (!done) ++launched_before_done;
      }
    }
    CHECK_OR_REPORT(done == 1, "step %zu (%s): %zu backward_done events", s, mode, done);
    CHECK_OR_REPORT(next == buckets, "step %zu (%s): %zu of %zu buckets launched: %s", s, mode, next, buckets,
                    seen.c_str());
    CHECK_OR_REPORT(launched_before_done >= 1, "step %zu (%s): no bucket launched before backward finished: %s", s,
                    mode, seen.c_str());
    if (s == 1) std::printf("rank %d: trace of a plain step: %s\n", me, seen.c_str());
  }
}

namespace {

// linear 4->5, batch norm over 5 channels (two buffers), linear 5->out; with `extra`, a linear out->2.
std::shared_ptr<Sequential> sync_model(int64_t out, bool extra) {
  Generator gen(3);
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<nn::Linear>(4, 5, gen));
  m->add(std::make_shared<nn::BatchNorm2d>(5));
  m->add(std::make_shared<nn::Linear>(5, out, gen));
  if (extra) m->add(std::make_shared<nn::Linear>(out, 2, gen));
  m->to(g_device);
  return m;
}

double param_value(int r, size_t k, int64_t j) { return 1000.0 * r + 10.0 * static_cast<double>(k) + 0.5 * j; }
double buffer_value(int r, size_t k, int64_t j) { return 2000.0 * r + 10.0 * static_cast<double>(k) + 0.25 * j; }

void set_values(const nn::NamedTensors& ts, int r, double (*value)(int, size_t, int64_t)) {
  for (size_t k = 0; k < ts.size(); ++k) {
    Tensor t = ts[k].second;
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(value(r, k, static_cast<int64_t>(j)));
    t.copy_(device_tensor(v, t.shape()));
  }
}

Values expected_values(const nn::NamedTensors& ts, const std::function<double(size_t, int64_t)>& f) {
  std::vector<int64_t> sizes;
  for (auto& [name, t] : ts) sizes.push_back(t.numel());
  return tabulate(sizes, f);
}

Values values_of(const nn::NamedTensors& ts) {
  std::vector<Tensor> v;
  for (auto& [name, t] : ts) v.push_back(t);
  return host_values(v);
}

Values zeros_like(const Values& v) {
  Values z = v;
  for (auto& p : z) std::fill(p.begin(), p.end(), 0.0);
  return z;
}

}  // namespace

void scenario_sync(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  optim::SgdOptions so;
  {
    auto model = sync_model(3, false);
    set_values(model->named_parameters(), me, param_value);
    set_values(model->named_buffers(), me, buffer_value);
    dist::DistOpt opt(std::make_shared<optim::SGD>(model->parameters(), so), comm, small_buckets());
    opt.sync_parameters(*model);
    // Everyone now holds rank 0's values, exactly.
    Values p = values_of(model->named_parameters()), b = values_of(model->named_buffers());
    expect_near("parameters after sync_parameters", p,
                expected_values(model->named_parameters(), [](size_t k, int64_t j) { return param_value(0, k, j); }),
                zeros_like(p));
    expect_near("buffers after sync_parameters", b,
                expected_values(model->named_buffers(), [](size_t k, int64_t j) { return buffer_value(0, k, j); }),
                zeros_like(b));
    expect_no_error("check_consistency on identical replicas", [&] { opt.check_consistency(); });

    // One rank's value moves: every rank hears which tensor differs.
    Tensor w2 = model->named_parameters()[4].second, mean1 = model->named_buffers()[0].second;
    CHECK_OR_REPORT(model->named_parameters()[4].first == "2.weight" && model->named_buffers()[0].first ==
                    "1.running_mean", "unexpected parameter names in the test model");
    if (me == W - 1) poke(w2, 3, 0.25);
    expect_error("perturbed parameter", me, [&] { opt.check_consistency(); }, {"2.weight"});
    if (me == W - 1) poke(w2, 3, -0.25);
    expect_no_error("check_consistency after restoring", [&] { opt.check_consistency(); });
    if (me == W - 1) poke(mean1, 2, 1.0);
    expect_error("perturbed buffer", me, [&] { opt.check_consistency(); }, {"1.running_mean"});

    // average_buffers: every rank ends with the mean of all ranks' statistics.
    set_values(model->named_buffers(), me, buffer_value);
    opt.average_buffers();
    Values avg = expected_values(model->named_buffers(), [W](size_t k, int64_t j) {
      double s = 0;
      for (int r = 0; r < W; ++r) s += buffer_value(r, k, j) / W;
      return s;
    });
    Values tol = avg;
    for (auto& t : tol)
      for (double& x : t) x = 1e-6 * std::fabs(x);
    expect_near("buffers after average_buffers", values_of(model->named_buffers()), avg, tol);
    expect_no_error("check_consistency after average_buffers", [&] { opt.check_consistency(); });
  }
  {  // Rank 1's last layer has another shape: every rank fails, naming the parameter and both shapes.
    auto model = sync_model(me == 1 ? 4 : 3, false);
    dist::DistOpt opt(std::make_shared<optim::SGD>(model->parameters(), so), comm, small_buckets());
    expect_error("another shape on rank 1", me, [&] { opt.sync_parameters(*model); },
                 {"2.weight", "f32[3, 5] on rank 0", "f32[4, 5] on rank 1"});
  }
  {  // Rank 1 has one more layer.
    auto model = sync_model(3, me == 1);
    dist::DistOpt opt(std::make_shared<optim::SGD>(model->parameters(), so), comm, small_buckets());
    expect_error("an extra layer on rank 1", me, [&] { opt.sync_parameters(*model); },
                 {"rank 0 has 6 parameter tensors", "rank 1 has 8"});
  }
}

namespace {

// A residual block whose batch norm runs fused with the skip connection and the ReLU
// (BatchNorm2d::forward_act, as the ResNets use it): bn(conv(x)) + skip(x), then ReLU.
class ResidualBn : public nn::Module {
 public:
  ResidualBn(std::shared_ptr<nn::BatchNorm2d> bn, Generator& gen) {
    conv_ = register_module("conv", std::make_shared<nn::Conv2d>(1, 4, 3, gen, 1, 1, false));
    bn_ = register_module("bn", std::move(bn));
    skip_ = register_module("skip", std::make_shared<nn::Conv2d>(1, 4, 1, gen, 1, 0, false));
  }
  Tensor forward(const Tensor& x) override { return bn_->forward_act(conv_->forward(x), skip_->forward(x), true); }

 private:
  std::shared_ptr<nn::Conv2d> conv_, skip_;
  std::shared_ptr<nn::BatchNorm2d> bn_;
};

// The residual block, then conv 4->4 3x3, batch norm, relu and linear 256->10 on 8x8 images (the
// convolutions without bias: batch norm cancels it); `norm` makes both batch norms.
std::shared_ptr<Sequential> bn_cnn(const std::function<std::shared_ptr<nn::BatchNorm2d>(int64_t)>& norm) {
  Generator gen(21);
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<ResidualBn>(norm(4), gen));
  m->add(std::make_shared<nn::Conv2d>(4, 4, 3, gen, 1, 1, false));
  m->add(norm(4));
  m->add(std::make_shared<nn::ReLU>());
  m->add(std::make_shared<nn::Flatten>());
  m->add(std::make_shared<nn::Linear>(256, 10, gen));
  m->to(g_device);
  return m;
}

// The step's global batch, each rank's block of rows shifted by its own offset: every rank's
// batch statistics differ from the global ones.
Batch shifted_batch(int step, int64_t rows, int W) {
  Batch b = global_batch(step, {1, 8, 8}, rows * W);
  for (int r = 1; r < W; ++r) {
    Tensor block = b.x.narrow(0, rows * r, rows);
    block.copy_(add_scalar(block, 1.5 * r));
  }
  return b;
}

}  // namespace

// Sync batch norm: W ranks at batch b (each its own block of rows) match one rank at batch W*b with
// plain batch norm, parameters and running statistics, whether the layers were converted or built
// as SyncBatchNorm2d. Without it (W > 1) the runs part.
void scenario_sync_bn(const std::shared_ptr<dist::Communicator>& comm) {
  const int W = comm->size(), me = comm->rank();
  const int64_t b = 16, steps = 3;
  optim::SgdOptions so;
  so.lr = 0.05;
  so.momentum = 0.9;
  auto plain_bn = [](int64_t c) { return std::make_shared<nn::BatchNorm2d>(c); };
  auto ref = bn_cnn(plain_bn);
  optim::SGD ref_opt(ref->parameters(), so);
  for (int s = 0; s < steps; ++s) {
    Batch g = shifted_batch(s, b, W);
    ref_opt.zero_grad();
    backward(softmax_cross_entropy(ref->forward(g.x), g.y));
    ref_opt.step();
  }
  auto run = [&](const std::shared_ptr<Sequential>& model, bool synced, dist::Shard shard = dist::Shard::none) {
    dist::DistOptOptions o = small_buckets();
    o.shard = shard;
    dist::DistOpt opt(std::make_shared<optim::SGD>(model->parameters(), so), comm, o);
    opt.sync_parameters(*model);
    for (int s = 0; s < steps; ++s) {
      Batch g = shifted_batch(s, b, W);
      opt.step(softmax_cross_entropy(model->forward(g.x.narrow(0, b * me, b)), g.y.narrow(0, b * me, b)));
    }
    if (synced) expect_no_error("sync batch norm: ranks agree, statistics included", [&] { opt.check_consistency(); });
  };
  auto converted = bn_cnn(plain_bn);
  CHECK_OR_REPORT(dist::convert_sync_batch_norm(*converted, comm) == 2, "expected two batch-norm layers");
  auto built = bn_cnn([&](int64_t c) { return std::make_shared<dist::SyncBatchNorm2d>(c, comm); });
  for (auto& [what, model] : {std::pair{"converted", converted}, std::pair{"SyncBatchNorm2d", built}}) {
    run(model, true);
    expect_close_models(strf("sync batch norm (%s) on %d ranks at batch %lld vs 1 rank at %lld", what, W,
                             static_cast<long long>(b), static_cast<long long>(b * W)),
                        model_values(*model), model_values(*ref), 1e-5);
    expect_close_models(strf("running statistics (%s)", what), values_of(model->named_buffers()),
                        values_of(ref->named_buffers()), 1e-5);
  }
  // Sharded state composes with it: the layers' all-reduces run between the buckets' reduce-scatters.
  for (dist::Shard shard : {dist::Shard::optimizer, dist::Shard::gradients}) {
    auto sharded = bn_cnn([&](int64_t c) { return std::make_shared<dist::SyncBatchNorm2d>(c, comm); });
    run(sharded, true, shard);
    expect_close_models(strf("sync batch norm with --shard %s vs without", dist::shard_name(shard)),
                        model_values(*sharded), model_values(*built), 1e-6);
    expect_close_models(strf("running statistics with --shard %s", dist::shard_name(shard)),
                        values_of(sharded->named_buffers()), values_of(built->named_buffers()), 0.0);
  }
  if (W > 1) {
    auto local = bn_cnn(plain_bn);
    run(local, false);
    Values got = values_of(local->named_buffers()), want = values_of(ref->named_buffers());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      for (size_t j = 0; j < got[i].size(); ++j) worst = std::max(worst, std::fabs(got[i][j] - want[i][j]));
    CHECK_OR_REPORT(worst > 1e-2, "local batch norm came within %.3g of the global statistics: the test data do "
                    "not tell sync batch norm apart", worst);
  }
}

}  // namespace distopt_worker
