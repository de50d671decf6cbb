// Softmax cross-entropy and classification metrics.
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

namespace {
void check_logits_labels(const Tensor& logits, const Tensor& labels, const char* op) {
  check_dim(logits, 2, op, "logits");
  check_dim(labels, 1, op, "labels");
  TANDEM_CHECK(labels.dtype() == DType::i32 || labels.dtype() == DType::i64, op, ": labels must be i32 or i64, got ",
               labels.str());
  TANDEM_CHECK(labels.size(0) == logits.size(0), op, ": ", labels.size(0), " labels for ", logits.size(0),
               " rows of logits");
  check_same_device(logits, labels, op);
}

// 16-bit logits (mixed precision) are read in f32; others as they are, contiguous.
Tensor f32_logits(const Tensor& logits) {
  const bool half = logits.dtype() == DType::f16 || logits.dtype() == DType::bf16;
  return half ? logits.to(DType::f32) : logits.contiguous();
}

// A running count of correct rows: one contiguous i64 element beside the logits.
void check_count(const Tensor& count, const Tensor& logits, const char* op) {
  TANDEM_CHECK(count.dtype() == DType::i64 && count.numel() == 1 && count.device() == logits.device() &&
                   count.is_contiguous(),
               op, ": the count must be one contiguous i64 element on ", logits.device().str(), ", got ", count.str());
}
}  // namespace

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels) {
  const char* op = "softmax_cross_entropy";
  check_dim(logits, 2, op, "logits");
  check_floating(logits, op, "logits");
  TANDEM_CHECK(logits.size(0) > 0, "softmax_cross_entropy: empty batch");
  const int64_t n = logits.size(0), c = logits.size(1);
  // Labels [N, 1] (C > 1) are neither: refused, not guessed at.
  const bool targets = labels.dim() == 2 && labels.size(0) == n && labels.size(1) == c;
  TANDEM_CHECK(targets || (labels.dim() == 1 && labels.size(0) == n), op, ": labels ", labels.str(),
               " do not fit logits ", logits.str(), "; give class indices [", n, "] (i32 or i64) or targets [", n,
               ", ", c, "] (a one-hot row or a distribution over the classes per sample)");
  if (!targets) check_logits_labels(logits, labels, op);
  check_same_device(logits, labels, op);
  // The softmax and the loss stay f32 for 16-bit logits too.
  Tensor lc = f32_logits(logits);
  Tensor loss = Tensor::empty({}, lc.dtype(), logits.device());
  Tensor probs = empty_like(lc);
  const DType in_dtype = logits.dtype();
  if (targets) {
    // Targets are data, as class indices are: they take no gradient.
    Tensor tc = labels.detach().to(lc.dtype()).contiguous();
    be(lc).softmax_xent_targets_forward(lc, tc, loss, probs);
    return record_op(loss, {logits}, op, [probs, tc, in_dtype](const Tensor& g) {
      Tensor dlogits = empty_like(probs);
      be(probs).softmax_xent_targets_backward(probs, tc, g.contiguous().to(probs.dtype()), dlogits);
      return std::vector<Tensor>{dlogits.to(in_dtype)};
    });
  }
  Tensor yc = labels.contiguous();
  be(lc).softmax_xent_forward(lc, yc, loss, probs);
  return record_op(loss, {logits}, op, [probs, yc, in_dtype](const Tensor& g) {
    Tensor dlogits = empty_like(probs);
    be(probs).softmax_xent_backward(probs, yc, g.contiguous().to(probs.dtype()), dlogits);
    return std::vector<Tensor>{dlogits.to(in_dtype)};
  });
}

Tensor argmax(const Tensor& x) {
  check_dim(x, 2, "argmax", "input");
  Tensor out = Tensor::empty({x.size(0)}, DType::i64, x.device());
  if (x.size(0)) be(x).argmax_rows(f32_logits(x), out);
  return out;
}

Tensor count_correct(const Tensor& logits, const Tensor& labels) {
  check_logits_labels(logits, labels, "count_correct");
  Tensor out = Tensor::empty({}, DType::i64, logits.device());
  be(logits).count_correct(f32_logits(logits), labels.contiguous(), out);
  return out;
}

void add_correct(const Tensor& logits, const Tensor& labels, Tensor& count) {
  check_logits_labels(logits, labels, "add_correct");
  check_count(count, logits, "add_correct");
  be(logits).count_correct(f32_logits(logits), labels.contiguous(), count, true);
}

void add_loss_and_correct(const Tensor& loss, const Tensor& logits, const Tensor& labels, Tensor& loss_sum,
                          Tensor& count) {
  check_logits_labels(logits, labels, "add_loss_and_correct");
  check_count(count, logits, "add_loss_and_correct");
  TANDEM_CHECK(loss.dtype() == DType::f32 && loss.numel() == 1 && loss_sum.dtype() == DType::f32 &&
                   loss_sum.numel() == 1 && loss_sum.is_contiguous() && loss.device() == logits.device() &&
                   loss_sum.device() == logits.device(),
               "add_loss_and_correct: loss ", loss.str(), " and sum ", loss_sum.str(), " must be one f32 element each on ",
               logits.device().str());
  be(logits).tally_batch(loss.contiguous().view(loss_sum.shape()), f32_logits(logits), labels.contiguous(), loss_sum,
                         count);
}

}  // namespace tandem
