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
}  // namespace

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels) {
  check_logits_labels(logits, labels, "softmax_cross_entropy");
  check_floating(logits, "softmax_cross_entropy", "logits");
  TANDEM_CHECK(logits.size(0) > 0, "softmax_cross_entropy: empty batch");
  // 16-bit logits (mixed precision) are taken in f32: the softmax and the loss stay f32.
  const bool half = logits.dtype() == DType::f16 || logits.dtype() == DType::bf16;
  Tensor lc = half ? logits.to(DType::f32) : logits.contiguous(), yc = labels.contiguous();
  Tensor loss = Tensor::empty({}, lc.dtype(), logits.device());
  Tensor probs = empty_like(lc);
  be(lc).softmax_xent_forward(lc, yc, loss, probs);
  const DType in_dtype = logits.dtype();
  return record_op(loss, {logits}, "softmax_cross_entropy", [probs, yc, in_dtype](const Tensor& g) {
    Tensor dlogits = empty_like(probs);
    be(probs).softmax_xent_backward(probs, yc, g.contiguous().to(probs.dtype()), dlogits);
    return std::vector<Tensor>{dlogits.to(in_dtype)};
  });
}

Tensor argmax(const Tensor& x) {
  check_dim(x, 2, "argmax", "input");
  Tensor out = Tensor::empty({x.size(0)}, DType::i64, x.device());
  if (x.size(0)) be(x).argmax_rows(x.dtype() == DType::f16 || x.dtype() == DType::bf16 ? x.to(DType::f32) : x.contiguous(), out);
  return out;
}

Tensor count_correct(const Tensor& logits, const Tensor& labels) {
  check_logits_labels(logits, labels, "count_correct");
  Tensor out = Tensor::empty({}, DType::i64, logits.device());
  const bool half = logits.dtype() == DType::f16 || logits.dtype() == DType::bf16;
  be(logits).count_correct(half ? logits.to(DType::f32) : logits.contiguous(), labels.contiguous(), out);
  return out;
}

void add_correct(const Tensor& logits, const Tensor& labels, Tensor& count) {
  check_logits_labels(logits, labels, "add_correct");
  TANDEM_CHECK(count.dtype() == DType::i64 && count.numel() == 1 && count.device() == logits.device() &&
                   count.is_contiguous(),
               "add_correct: the count must be one contiguous i64 element on ", logits.device().str(), ", got ",
               count.str());
  const bool half = logits.dtype() == DType::f16 || logits.dtype() == DType::bf16;
  be(logits).count_correct(half ? logits.to(DType::f32) : logits.contiguous(), labels.contiguous(), count, true);
}

void add_loss_and_correct(const Tensor& loss, const Tensor& logits, const Tensor& labels, Tensor& loss_sum,
                          Tensor& count) {
  check_logits_labels(logits, labels, "add_loss_and_correct");
  TANDEM_CHECK(count.dtype() == DType::i64 && count.numel() == 1 && count.device() == logits.device() &&
                   count.is_contiguous(),
               "add_loss_and_correct: the count must be one contiguous i64 element on ", logits.device().str(),
               ", got ", count.str());
  TANDEM_CHECK(loss.dtype() == DType::f32 && loss.numel() == 1 && loss_sum.dtype() == DType::f32 &&
                   loss_sum.numel() == 1 && loss_sum.is_contiguous() && loss.device() == logits.device() &&
                   loss_sum.device() == logits.device(),
               "add_loss_and_correct: loss ", loss.str(), " and sum ", loss_sum.str(), " must be one f32 element each on ",
               logits.device().str());
  const bool half = logits.dtype() == DType::f16 || logits.dtype() == DType::bf16;
  be(logits).tally_batch(loss.contiguous().view(loss_sum.shape()), half ? logits.to(DType::f32) : logits.contiguous(), labels.contiguous(),
                         loss_sum, count);
}

}  // namespace tandem
