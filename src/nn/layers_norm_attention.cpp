// Layers of the normalisation and attention family: LayerNorm, RMSNorm, MultiHeadAttention.
#include <cmath>

#include "ops/padded_rows.h"
#include "tandem/autograd.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {

namespace {
void check_shape(const Shape& s, const char* layer) {
  TANDEM_CHECK(!s.empty(), layer, ": normalized_shape must have at least one dimension");
  for (int64_t e : s) TANDEM_CHECK(e > 0, layer, ": normalized_shape ", shape_str(s), " must have positive extents");
}
}  // namespace

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool affine, bool with_bias)
    : shape_(std::move(normalized_shape)), eps_(eps) {
  check_shape(shape_, "LayerNorm");
  if (affine) {
    weight = register_parameter("weight", Tensor::ones(shape_));
    if (with_bias) bias = register_parameter("bias", Tensor::zeros(shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, shape_, weight, bias, eps_); }

Tensor LayerNorm::forward_padded(const Tensor& x) {
  if (!x.defined() || !ops::bias_from_product(x.device()) || !grad_enabled()) return forward(x);
  return ops::layer_norm_padded(x, shape_, weight, bias, eps_);
}

std::string LayerNorm::describe() const {
  return detail::cat("LayerNorm(", shape_str(shape_), ", eps ", eps_, weight.defined() ? "" : ", no affine", ")");
}

RMSNorm::RMSNorm(Shape normalized_shape, double eps, bool affine) : shape_(std::move(normalized_shape)), eps_(eps) {
  check_shape(shape_, "RMSNorm");
  if (affine) weight = register_parameter("weight", Tensor::ones(shape_));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, shape_, weight, eps_); }

std::string RMSNorm::describe() const {
  return detail::cat("RMSNorm(", shape_str(shape_), ", eps ", eps_, weight.defined() ? "" : ", no affine", ")");
}

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads, Generator& gen, bool causal, bool bias,
                                       double dropout, uint64_t seed)
    : embed_dim_(embed_dim), heads_(num_heads), causal_(causal), dropout_(dropout), gen_(seed) {
  TANDEM_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0, "MultiHeadAttention: embed_dim ",
               embed_dim, " must be a positive multiple of num_heads ", num_heads);
  TANDEM_CHECK(dropout >= 0.0 && dropout < 1.0, "MultiHeadAttention: dropout ", dropout, " outside [0, 1)");
  q_proj = register_module("q_proj", std::make_shared<Linear>(embed_dim, embed_dim, gen, bias));
  k_proj = register_module("k_proj", std::make_shared<Linear>(embed_dim, embed_dim, gen, bias));
  v_proj = register_module("v_proj", std::make_shared<Linear>(embed_dim, embed_dim, gen, bias));
  out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, gen, bias));
}

Tensor MultiHeadAttention::forward(const Tensor& x) { return forward(x, x, x); }

Tensor MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value) {
  for (const Tensor* t : {&query, &key, &value}) {
    TANDEM_CHECK(t->defined() && t->dim() == 3 && t->size(2) == embed_dim_, "MultiHeadAttention: inputs must be [B, T, ",
                 embed_dim_, "], got ", t->defined() ? t->str() : std::string("an undefined tensor"));
  }
  TANDEM_CHECK(key.size(0) == query.size(0) && value.size(0) == query.size(0) && value.size(1) == key.size(1),
               "MultiHeadAttention: query ", query.str(), ", key ", key.str(), " and value ", value.str(),
               " must agree in batch, and key and value in length");
  const int64_t b = query.size(0), tq = query.size(1), tk = key.size(1), hd = embed_dim_ / heads_;
  // [B, T, E] -> rows [B*T, E] for the projections -> heads [B, H, T, hd].
  auto heads = [&](Linear& proj, const Tensor& x, int64_t t) {
    Tensor y = proj.forward(reshape(x, {b * t, embed_dim_}));
    return permute(reshape(y, {b, t, heads_, hd}), {0, 2, 1, 3});
  };
  Tensor q = heads(*q_proj, query, tq), k = heads(*k_proj, key, tk), v = heads(*v_proj, value, tk);
  const double p = is_training() ? dropout_ : 0.0;
  Tensor a = scaled_dot_product_attention(q, k, v, causal_, p, 0.0, p > 0.0 ? &gen_ : nullptr);
  Tensor rows = reshape(permute(a, {0, 2, 1, 3}), {b * tq, embed_dim_});
  return reshape(out_proj->forward(rows), {b, tq, embed_dim_});
}

std::string MultiHeadAttention::describe() const {
  return detail::cat("MultiHeadAttention(", embed_dim_, ", ", heads_, " heads", causal_ ? ", causal" : "",
                     dropout_ > 0 ? detail::cat(", dropout ", dropout_) : std::string(), ")");
}

}  // namespace tandem::nn
