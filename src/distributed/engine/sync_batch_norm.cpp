// Sync batch norm from the backend's per-channel kernels: bias_grad sums over N, H, W per channel,
// bias_add adds a per-channel vector (broadcasting it when added to zeros). Forward all-reduces the
// per-channel sums and the sample count, then the centred squares (two passes, as the local kernel,
// so the variance stays accurate when |mean| >> std); backward all-reduces sum(dy) and
// sum(dy * xhat). Parameter gradients stay this rank's own: DistOpt averages them.
#include "tandem/distributed/sync_batch_norm.h"

#include "backend/backend.h"

namespace tandem::dist {

namespace {

using backend::Binary;

struct Geometry {
  int64_t n, c, s;  // x viewed as [n, c, s]
};

backend::Backend& be(const Tensor& t) { return backend::backend_for(t.device()); }

Tensor like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

// out = a op b (same shapes).
Tensor binary(Binary op, const Tensor& a, const Tensor& b) {
  Tensor out = like(a);
  be(a).binary(op, a, b, out);
  return out;
}

// v [c] broadcast to [n, c, s].
Tensor per_channel(const Tensor& v, const Geometry& g) {
  Tensor out = Tensor::zeros({g.n, g.c, g.s}, v.dtype(), v.device());
  be(v).bias_add(out, v, g.n, g.c, g.s, out);
  return out;
}

// x [n, c, s] + v [c] per channel.
Tensor add_per_channel(const Tensor& x, const Tensor& v, const Geometry& g) {
  Tensor out = like(x);
  be(x).bias_add(x, v, g.n, g.c, g.s, out);
  return out;
}

// Per-channel sums of x [n, c, s] into out [c].
void channel_sums(const Tensor& x, const Geometry& g, Tensor out) { be(x).bias_grad(x, g.n, g.c, g.s, out); }

// One value (a one-element tensor) repeated c times.
Tensor repeat(const Tensor& one, int64_t c) {
  Tensor out = Tensor::zeros({c}, one.dtype(), one.device());
  be(one).bias_add(out, one, c, 1, 1, out);
  return out;
}

void all_reduce_sum(Communicator& comm, Tensor& t) { comm.all_reduce(t, ReduceOp::Sum)->wait(); }

}  // namespace

Tensor sync_batch_norm2d(const Tensor& x, nn::BatchNorm2d& bn, const std::shared_ptr<Communicator>& comm) {
  TANDEM_CHECK(x.dim() == 4 && (x.dtype() == DType::f32 || x.dtype() == DType::f16 || x.dtype() == DType::bf16),
               "sync batch norm takes [N, C, H, W] in f32, f16 or bf16, got ", x.str());
  TANDEM_CHECK(x.size(1) == bn.gamma.size(0), "sync batch norm: ", x.str(), " does not have the ", bn.gamma.size(0),
               " channels of the layer");
  TANDEM_CHECK(x.device() == comm->device(), "sync batch norm: ", x.str(), " is not on the communicator's device ",
               comm->device().str());
  const Geometry g{x.size(0), x.size(1), x.size(2) * x.size(3)};
  const int64_t c = g.c;
  // Statistics and normalisation in f32 whatever the activations' type (mixed precision), which the
  // output and the input's gradient take back.
  const DType io = x.dtype();
  Tensor xc = x.to(DType::f32).contiguous().view({g.n, g.c, g.s});

  // Global count and mean: [sum x per channel, count] all-reduced in one message.
  Tensor first = Tensor::empty({c + 1}, DType::f32, x.device());
  channel_sums(xc, g, first.narrow(0, 0, c));
  first.narrow(0, c, 1).fill_(static_cast<double>(g.n * g.s));
  all_reduce_sum(*comm, first);
  Tensor count = repeat(first.narrow(0, c, 1), c);
  Tensor mean = binary(Binary::Div, first.narrow(0, 0, c), count);
  // Global variance from the centred squares.
  Tensor neg_mean = like(mean);
  be(mean).affine(mean, -1.0, 0.0, neg_mean);
  Tensor centred = add_per_channel(xc, neg_mean, g);
  Tensor sq = Tensor::empty({c}, DType::f32, x.device());
  channel_sums(binary(Binary::Mul, centred, centred), g, sq);
  all_reduce_sum(*comm, sq);
  Tensor var = binary(Binary::Div, sq, count);
  Tensor invstd = like(var);
  be(var).affine(var, 1.0, bn.eps(), invstd);
  be(var).unary(backend::Unary::Sqrt, invstd, invstd);
  be(var).binary(Binary::Div, Tensor::ones({c}, DType::f32, x.device()), invstd, invstd);

  // Running statistics: the same global values on every rank; the variance unbiased.
  const double m = bn.momentum();
  Tensor count_less_one = like(count);
  be(count).affine(count, 1.0, -1.0, count_less_one);
  be(mean).affine(bn.running_mean, 1.0 - m, 0.0, bn.running_mean);
  be(mean).axpy(m, mean, bn.running_mean);
  be(mean).affine(bn.running_var, 1.0 - m, 0.0, bn.running_var);
  be(mean).axpy(m, binary(Binary::Div, sq, count_less_one), bn.running_var);

  Tensor xhat = binary(Binary::Mul, centred, per_channel(invstd, g));
  Tensor y = add_per_channel(binary(Binary::Mul, xhat, per_channel(bn.gamma.detach(), g)), bn.beta.detach(), g);
  y = y.view(x.shape()).to(io);
  Tensor gamma = bn.gamma.detach();
  return record_op(y, {x, bn.gamma, bn.beta}, "sync_batch_norm2d",
                   [comm, g, xhat, invstd, gamma, count, io, shape = x.shape()](const Tensor& grad) {
    const int64_t c = g.c;
    Tensor dy = grad.to(DType::f32).contiguous().view({g.n, g.c, g.s});
    // This rank's sums are its parameter gradients; their global values shape dx.
    Tensor sums = Tensor::empty({2 * c}, DType::f32, dy.device());
    channel_sums(dy, g, sums.narrow(0, 0, c));
    channel_sums(binary(Binary::Mul, dy, xhat), g, sums.narrow(0, c, c));
    Tensor dbeta = sums.narrow(0, 0, c).clone(), dgamma = sums.narrow(0, c, c).clone();
    all_reduce_sum(*comm, sums);
    // dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), the means over the global batch.
    Tensor mean_dy = binary(Binary::Div, sums.narrow(0, 0, c), count);
    Tensor mean_dy_xhat = binary(Binary::Div, sums.narrow(0, c, c), count);
    Tensor neg = like(mean_dy);
    be(dy).affine(mean_dy, -1.0, 0.0, neg);
    Tensor t = add_per_channel(dy, neg, g);
    t = binary(Binary::Sub, t, binary(Binary::Mul, xhat, per_channel(mean_dy_xhat, g)));
    Tensor dx = binary(Binary::Mul, t, per_channel(binary(Binary::Mul, gamma, invstd), g)).view(shape).to(io);
    return std::vector<Tensor>{dx, dgamma, dbeta};
  });
}

SyncBatchNorm2d::SyncBatchNorm2d(int64_t channels, std::shared_ptr<Communicator> comm, double momentum, double eps)
    : nn::BatchNorm2d(channels, momentum, eps) {
  TANDEM_CHECK(comm != nullptr, "SyncBatchNorm2d needs a communicator");
  set_train_forward([comm](nn::BatchNorm2d& self, const Tensor& x) { return sync_batch_norm2d(x, self, comm); });
}

std::string SyncBatchNorm2d::describe() const { return "Sync" + nn::BatchNorm2d::describe(); }

int convert_sync_batch_norm(nn::Module& model, const std::shared_ptr<Communicator>& comm) {
  TANDEM_CHECK(comm != nullptr, "convert_sync_batch_norm needs a communicator");
  int layers = 0;
  model.apply([&](nn::Module& m) {
    auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m);
    if (!bn) return;
    ++layers;
    if (comm->size() > 1)
      bn->set_train_forward([comm](nn::BatchNorm2d& self, const Tensor& x) { return sync_batch_norm2d(x, self, comm); });
  });
  return layers;
}

}  // namespace tandem::dist
