// powerSGD (Vogels, Karimireddy and Jaggi, 2019): each gradient matrix M (a parameter's gradient
// viewed as [shape[0], rest]) travels as two thin factors. With Q from the previous step (a warm
// start), P = M Q is summed over ranks and orthonormalised, Q = M^T P is averaged, and every rank
// then holds the same rank-r approximation P Q^T of the ranks' average M. What the approximation
// misses on this rank is kept and added to its next gradient (error feedback). Vectors (biases,
// norm scales) and matrices too small to gain are all-reduced whole. Every product runs on the
// device through gemm, with no host wait.
//
// P and Q are stored transposed ([r, rows] and [r, cols]) so that each factor vector is a
// contiguous row: orthonormalising works on rows.
#include <algorithm>

#include "backend/backend.h"
#include "distributed/engine/grad_codec.h"
#include "tandem/random.h"

namespace tandem::dist::detail {

namespace {

// A tiny multiple of the first Q is added to Q before each step, so that a factor that collapsed to
// zero (a parameter with no gradient for a step) recovers; against a live Q it is far below rounding.
constexpr double kReseed = 1e-6;
// Added to squared norms before dividing by them: a zero factor stays zero instead of NaN.
constexpr double kTinyNorm = 1e-30;

class PowerSgdCodec final : public GradCodec {
 public:
  PowerSgdCodec(const CodecEnv& env, int rank, bool feedback)
      : env_(env), rank_(rank), feedback_(feedback), q_(env.shapes.size()), q0_(env.shapes.size()) {}

  bool keeps_residual() const override { return feedback_; }
  void on_layout(const std::vector<Bucket>& buckets) override;
  void launch(Bucket& b) override;
  void finish(Bucket& b) override;
  std::vector<Tensor> carried_buffers() override {
    std::vector<Tensor> out;
    for (Plan& p : plans_)
      if (p.q_buf.defined()) out.push_back(p.q_buf);
    return out;
  }
  std::vector<std::pair<std::string, Tensor>> named_state() override {
    std::vector<std::pair<std::string, Tensor>> out;
    for (size_t i = 0; i < q_.size(); ++i)
      if (q_[i].defined()) out.emplace_back("q/" + std::to_string(i), q_[i]);
    return out;
  }

 private:
  struct Matrix {
    int param;
    int64_t start, rows, cols, r;  // start: in the bucket
    Tensor p, q;                   // [r, rows] and [r, cols], views of the bucket's buffers
  };
  struct Whole {
    int64_t start, numel;  // a tensor sent uncompressed: its range in the bucket
  };
  struct Plan {
    std::vector<Matrix> matrices;
    std::vector<Whole> whole;
    Tensor p_buf, q_buf, whole_buf;
  };

  backend::Backend& be() { return backend::backend_for(env_.device); }
  Tensor matrix_of(Bucket& b, const Matrix& m) { return b.grad.narrow(0, m.start, m.rows * m.cols).view({m.rows, m.cols}); }
  void orthonormalise_rows(Tensor& p);

  CodecEnv env_;
  int rank_;
  bool feedback_;
  std::vector<Plan> plans_;
  std::vector<Tensor> q_;   // per parameter: its Q, kept across layouts (the warm start)
  std::vector<Tensor> q0_;  // per parameter: its first Q, the same on every rank
  Tensor scalar_, one_, row_;  // orthonormalisation scratch: [1, 1], [1], the longest P row
  BucketWork whole_work_, p_work_, q_work_;
};

void PowerSgdCodec::on_layout(const std::vector<Bucket>& buckets) {
  whole_work_.reset(buckets.size());
  p_work_.reset(buckets.size());
  q_work_.reset(buckets.size());
  std::vector<Plan> plans(buckets.size());
  int64_t longest_row = 1;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& b = buckets[k];
    Plan& plan = plans[k];
    int64_t p_total = 0, q_total = 0, whole_total = 0;
    for (size_t j = 0; j < b.params.size(); ++j) {
      const int i = b.params[j];
      const Shape& shape = env_.shapes[static_cast<size_t>(i)];
      const int64_t numel = shape_numel(shape);
      const int64_t rows = shape.size() >= 2 ? shape[0] : 1, cols = rows > 0 ? numel / rows : 0;
      const int64_t r = std::min<int64_t>({rank_, rows, cols});
      // Compressed only when the factors take at most half the values of the matrix.
      if (shape.size() >= 2 && r >= 1 && 2 * r * (rows + cols) <= numel) {
        plan.matrices.push_back({i, b.starts[j], rows, cols, r, Tensor(), Tensor()});
        p_total += r * rows;
        q_total += r * cols;
        longest_row = std::max(longest_row, rows);
      } else {
        plan.whole.push_back({b.starts[j], numel});
        whole_total += numel;
      }
    }
    if (p_total) {
      plan.p_buf = Tensor::empty({p_total}, DType::f32, env_.device);
      plan.q_buf = Tensor::empty({q_total}, DType::f32, env_.device);
    }
    if (whole_total) plan.whole_buf = Tensor::empty({whole_total}, DType::f32, env_.device);
    int64_t p_off = 0, q_off = 0;
    for (Matrix& m : plan.matrices) {
      m.p = plan.p_buf.narrow(0, p_off, m.r * m.rows).view({m.r, m.rows});
      m.q = plan.q_buf.narrow(0, q_off, m.r * m.cols).view({m.r, m.cols});
      p_off += m.r * m.rows;
      q_off += m.r * m.cols;
      Tensor& q = q_[static_cast<size_t>(m.param)];
      Tensor& q0 = q0_[static_cast<size_t>(m.param)];
      if (!q0.defined()) {
        // Seeded by the parameter's index: every rank starts from the same Q.
        Generator gen(0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(m.param));
        q0 = Tensor::normal({m.r, m.cols}, 0.0, 1.0, gen, DType::f32, env_.device);
      }
      m.q.copy_(q.defined() ? q : q0);
      q = m.q;
    }
  }
  plans_ = std::move(plans);
  scalar_ = Tensor::empty({1, 1}, DType::f32, env_.device);
  one_ = Tensor::ones({1}, DType::f32, env_.device);
  row_ = Tensor::empty({longest_row}, DType::f32, env_.device);
}

void PowerSgdCodec::launch(Bucket& b) {
  const size_t k = static_cast<size_t>(b.index);
  Plan& plan = plans_[k];
  if (feedback_) be().binary(backend::Binary::Add, b.grad, b.residual, b.grad);
  if (!plan.whole.empty()) {
    int64_t off = 0;
    for (const Whole& w : plan.whole) {
      be().copy_bytes(b.grad.narrow(0, w.start, w.numel).data_ptr(), plan.whole_buf.narrow(0, off, w.numel).data_ptr(),
                      static_cast<size_t>(w.numel) * 4, env_.device.index);
      off += w.numel;
    }
    whole_work_[k] = env_.comm.all_reduce(plan.whole_buf, ReduceOp::Avg);
    count_all_reduce(env_.stats, static_cast<int64_t>(plan.whole_buf.nbytes()), env_.world);
  }
  if (plan.matrices.empty()) return;
  for (Matrix& m : plan.matrices) {
    be().axpy(kReseed, q0_[static_cast<size_t>(m.param)], m.q);
    be().gemm(false, true, m.r, m.rows, m.cols, 1.0, m.q, matrix_of(b, m), 0.0, m.p);  // P^T = Q^T M^T
  }
  // Summed, not averaged: P is orthonormalised next, so its scale does not matter.
  p_work_[k] = env_.comm.all_reduce(plan.p_buf, ReduceOp::Sum);
  count_all_reduce(env_.stats, static_cast<int64_t>(plan.p_buf.nbytes()), env_.world);
}

void PowerSgdCodec::finish(Bucket& b) {
  const size_t k = static_cast<size_t>(b.index);
  Plan& plan = plans_[k];
  if (!plan.whole.empty()) {
    timed_wait(whole_work_[k], env_.stats);
    int64_t off = 0;
    for (const Whole& w : plan.whole) {
      be().copy_bytes(plan.whole_buf.narrow(0, off, w.numel).data_ptr(), b.grad.narrow(0, w.start, w.numel).data_ptr(),
                      static_cast<size_t>(w.numel) * 4, env_.device.index);
      off += w.numel;
    }
  }
  if (plan.matrices.empty()) return;
  timed_wait(p_work_[k], env_.stats);
  for (Matrix& m : plan.matrices) {
    orthonormalise_rows(m.p);
    be().gemm(false, false, m.r, m.cols, m.rows, 1.0, m.p, matrix_of(b, m), 0.0, m.q);  // Q^T = P^T M
  }
  q_work_[k] = env_.comm.all_reduce(plan.q_buf, ReduceOp::Avg);
  count_all_reduce(env_.stats, static_cast<int64_t>(plan.q_buf.nbytes()), env_.world);
  timed_wait(q_work_[k], env_.stats);
  for (Matrix& m : plan.matrices) {
    Tensor mat = matrix_of(b, m);
    Tensor residual = feedback_ ? b.residual.narrow(0, m.start, m.rows * m.cols).view({m.rows, m.cols}) : Tensor();
    if (feedback_) residual.copy_(mat);
    be().gemm(true, false, m.rows, m.cols, m.r, 1.0, m.p, m.q, 0.0, mat);  // M = P Q^T
    if (feedback_) be().binary(backend::Binary::Sub, residual, mat, residual);
  }
}

// Gram-Schmidt over the rows of p, all on the device: each row loses its projections on the rows
// before it, twice (a row that was nearly a combination of them keeps only rounding noise after one
// pass, not yet orthogonal to them), then is scaled to unit length.
void PowerSgdCodec::orthonormalise_rows(Tensor& p) {
  const int64_t r = p.size(0), n = p.size(1);
  Tensor row = row_.narrow(0, 0, n).view({1, n});
  for (int64_t i = 0; i < r; ++i) {
    Tensor pi = p.narrow(0, i, 1);
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t j = 0; j < i; ++j) {
        Tensor pj = p.narrow(0, j, 1);
        be().gemm(false, true, 1, 1, n, 1.0, pi, pj, 0.0, scalar_);   // c = p_i . p_j
        be().gemm(false, false, 1, n, 1, -1.0, scalar_, pj, 1.0, pi);  // p_i -= c p_j
      }
    be().gemm(false, true, 1, 1, n, 1.0, pi, pi, 0.0, scalar_);
    Tensor s = scalar_.view({1});
    be().affine(s, 1.0, kTinyNorm, s);
    be().unary(backend::Unary::Sqrt, s, s);
    be().binary(backend::Binary::Div, one_, s, s);  // 1 / |p_i|
    be().gemm(false, false, 1, n, 1, 1.0, scalar_, pi, 0.0, row);
    be().copy_bytes(row.data_ptr(), pi.data_ptr(), static_cast<size_t>(n) * 4, env_.device.index);
  }
}

}  // namespace

std::unique_ptr<GradCodec> make_power_sgd_codec(const CodecEnv& env, const SyncOptions& o) {
  TANDEM_CHECK(o.rank >= 1, "powerSGD: the rank of the approximation must be at least 1, got ", o.rank);
  TANDEM_CHECK(env.grad_dtype == DType::f32, "powerSGD compresses f32 gradients, not ", dtype_name(env.grad_dtype));
  return std::make_unique<PowerSgdCodec>(env, o.rank, o.error_feedback);
}

}  // namespace tandem::dist::detail
