// GPT-2's transformer layers: SelfAttention (one query-key-value projection), FeedForward and the pre-norm
// TransformerBlock, with the key-value cache of incremental decoding.
#include <cmath>
#include <tuple>

#include "tandem/autograd.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {

namespace {

// Redraws a freshly made Linear's weight from N(0, std^2): its own initialisation drew N(0, s^2), so a scale
// by std / s gives the wanted distribution without drawing again.
void rescale_weight(Linear& l, double std) {
  NoGradGuard no_grad;
  const double s = std::sqrt(2.0 / static_cast<double>(l.weight.size(0) + l.weight.size(1)));
  l.weight.copy_(scale(l.weight, std / s));
}

void check_std(double v, const char* layer, const char* what) {
  TANDEM_CHECK(std::isfinite(v) && v >= 0.0, layer, ": ", what, " ", v, " must be a finite non-negative number");
}

}  // namespace

// ---- SelfAttention

SelfAttention::SelfAttention(int64_t width, int64_t heads, Generator& gen, bool causal, bool bias, double dropout,
                             double init_std, double proj_std)
    : SelfAttention(width, heads, heads, nullptr, gen, causal, bias, bias, dropout, init_std, proj_std) {}

SelfAttention::SelfAttention(int64_t width, int64_t heads, int64_t kv_heads, std::shared_ptr<RotaryCache> rotary,
                             Generator& gen, bool causal, bool bias, bool proj_bias, double dropout, double init_std,
                             double proj_std)
    : width_(width), heads_(heads), kv_heads_(kv_heads), causal_(causal), dropout_(dropout), rotary_(std::move(rotary)) {
  TANDEM_CHECK(width > 0 && heads > 0 && width % heads == 0, "SelfAttention: width ", width,
               " must be a positive multiple of heads ", heads);
  TANDEM_CHECK(kv_heads > 0 && heads % kv_heads == 0, "SelfAttention: kv_heads ", kv_heads,
               " must be a positive divisor of heads ", heads);
  TANDEM_CHECK(!rotary_ || (width / heads) % 2 == 0, "SelfAttention: rotary position embeddings need an even head "
               "size, got ", width / heads);
  TANDEM_CHECK(dropout >= 0.0 && dropout < 1.0, "SelfAttention: dropout ", dropout, " outside [0, 1)");
  check_std(init_std, "SelfAttention", "init_std");
  check_std(proj_std, "SelfAttention", "proj_std");
  const int64_t d = width / heads;
  c_attn = register_module("c_attn", std::make_shared<Linear>(width, width + 2 * kv_heads * d, gen, bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(width, width, gen, proj_bias));
  rescale_weight(*c_attn, init_std);
  rescale_weight(*c_proj, proj_std);
  gen_ = Generator(gen.next_below(uint64_t(1) << 62));
}

std::pair<Tensor, Tensor> RotaryCache::at(int64_t start, int64_t length, DType dtype, Device device) {
  TANDEM_CHECK(start >= 0 && length >= 0 && start + length <= positions_, "rotary position embeddings: positions ",
               start, " to ", start + length - 1, " are beyond the ", positions_, " the tables hold (the context)");
  if (!cos_.defined() || cos_.dtype() != dtype || cos_.device() != device)
    std::tie(cos_, sin_) = rotary_tables(head_dim_, positions_, theta_, scaling_, dtype, device);
  return {cos_.narrow(0, start, length), sin_.narrow(0, start, length)};
}

Tensor SelfAttention::attend(const Tensor& qkv, int64_t start) {
  const double p = is_training() ? dropout_ : 0.0;
  Generator* gen = p > 0.0 ? &gen_ : nullptr;
  if (!rotary_) return packed_self_attention(qkv, heads_, kv_heads_, causal_, p, 0.0, gen, doc_pos_);
  // The query and key heads rotated in one pass over the packed product, which attention then reads in place.
  // Packed documents: each token at its position in its document (below T, the tables' rows from start 0).
  auto [cos, sin] = rotary_->at(start, qkv.size(1), qkv.dtype(), qkv.device());
  return packed_self_attention(rotary_packed(qkv, cos, sin, heads_, kv_heads_, 0, doc_pos_), heads_, kv_heads_,
                               causal_, p, 0.0, gen, doc_pos_);
}

void SelfAttention::check_input(const Tensor& x, const char* what) const {
  TANDEM_CHECK(x.defined() && x.dim() == 3 && x.size(2) == width_, "SelfAttention", what, ": input must be [B, T, ",
               width_, "], got ", x.defined() ? x.str() : std::string("an undefined tensor"));
}

Tensor SelfAttention::forward(const Tensor& x) {
  check_input(x, "");
  // [B, T, 3C]: the query, key and value side by side -> [B, T, C], the heads side by side.
  return c_proj->forward(attend(c_attn->forward(x), 0));
}

Tensor SelfAttention::forward_residual(const Tensor& x, const Tensor& residual) {
  check_input(x, ".forward_residual");
  return linear_residual(attend(c_attn->forward(x), 0), c_proj->weight, c_proj->bias, residual);
}

Tensor SelfAttention::forward_cached(const Tensor& x, KVCache& cache, int64_t capacity) {
  check_input(x, ".forward_cached");
  NoGradGuard no_grad;
  const int64_t b = x.size(0), tn = x.size(1), hd = width_ / heads_;
  TANDEM_CHECK(tn > 0, "SelfAttention.forward_cached: no positions in ", x.str());
  std::vector<Tensor> qkv = split(c_attn->forward(x), {width_, kv_heads_ * hd, kv_heads_ * hd}, 2);
  if (rotary_) {  // the new positions' rotations, at their places after the cached ones
    auto [cos, sin] = rotary_->at(cache.length, tn, qkv[0].dtype(), x.device());
    auto rotate = [&](const Tensor& y, int64_t h) {
      Tensor r = rotary_embedding(permute(reshape(y, {b, tn, h, hd}), {0, 2, 1, 3}), cos, sin);
      return reshape(permute(r, {0, 2, 1, 3}), {b, tn, h * hd});
    };
    qkv[0] = rotate(qkv[0], heads_);
    qkv[1] = rotate(qkv[1], kv_heads_);
  }
  // The new keys and values, position-major [Tn, B, Hkv, hd], as the cache keeps them.
  auto by_position = [&](const Tensor& y) { return permute(reshape(y, {b, tn, kv_heads_, hd}), {1, 0, 2, 3}); };
  Tensor k_new = by_position(qkv[1]), v_new = by_position(qkv[2]);
  const Shape want{capacity, b, kv_heads_, hd};
  const bool fits = cache.keys.defined() && cache.keys.shape() == want && cache.keys.dtype() == k_new.dtype() &&
                    cache.keys.device() == k_new.device() && cache.values.defined() &&
                    cache.values.shape() == want;
  if (cache.length == 0 && !fits) {
    TANDEM_CHECK(capacity > 0, "SelfAttention.forward_cached: capacity ", capacity, " must be positive");
    cache.keys = Tensor::empty(want, k_new.dtype(), k_new.device());
    cache.values = Tensor::empty(want, v_new.dtype(), v_new.device());
  } else if (!fits) {
    TANDEM_CHECK(false, "SelfAttention.forward_cached: the cache holds ", cache.length, " positions of keys ",
                 cache.keys.defined() ? cache.keys.str() : std::string("(none)"), ", which do not match the input ",
                 x.str(), " (batch, dtype or device) or the capacity ", capacity, "; clear it first");
  }
  const int64_t len = cache.length, total = len + tn;
  TANDEM_CHECK(total <= cache.capacity(), "SelfAttention.forward_cached: ", tn, " more positions after ", len,
               " exceed the cache's capacity of ", cache.capacity());
  cache.keys.narrow(0, len, tn).copy_(k_new);
  cache.values.narrow(0, len, tn).copy_(v_new);
  cache.length = total;
  // Every cached position as [B, H, total, hd] (strided views of the cache).
  Tensor keys = permute(cache.keys.narrow(0, 0, total), {1, 2, 0, 3});
  Tensor values = permute(cache.values.narrow(0, 0, total), {1, 2, 0, 3});
  Tensor q = permute(reshape(qkv[0], {b, tn, heads_, hd}), {0, 2, 1, 3});
  Tensor a;
  if (!causal_ || tn == 1) {
    a = scaled_dot_product_attention(q, keys, values, false);  // one query sees every cached position
  } else if (len == 0) {
    a = scaled_dot_product_attention(q, keys, values, true);  // the whole prefix at once: the top-left mask
  } else {
    // New positions after cached ones: query i sees the positions up to len + i (the mask would be aligned
    // at the bottom right), one query at a time.
    std::vector<Tensor> rows;
    for (int64_t i = 0; i < tn; ++i)
      rows.push_back(scaled_dot_product_attention(q.narrow(2, i, 1), keys.narrow(2, 0, len + i + 1),
                                                  values.narrow(2, 0, len + i + 1), false));
    a = concat(rows, 2);
  }
  return c_proj->forward(reshape(permute(a, {0, 2, 1, 3}), {b, tn, width_}));
}

std::string SelfAttention::describe() const {
  return detail::cat("SelfAttention(", width_, ", ", heads_, " heads",
                     kv_heads_ != heads_ ? detail::cat(", ", kv_heads_, " key-value heads") : std::string(),
                     rotary_ ? detail::cat(", rotary theta ", rotary_->theta()) : std::string(), causal_ ? ", causal" : "",
                     dropout_ > 0 ? detail::cat(", dropout ", dropout_) : std::string(), ")");
}

// ---- FeedForward

FeedForward::FeedForward(int64_t width, int64_t hidden, Generator& gen, bool bias, double init_std, double proj_std)
    : FeedForward(width, hidden, gen, bias, init_std, proj_std, false) {}

FeedForward::FeedForward(int64_t width, int64_t hidden, Generator& gen, bool bias, double init_std, double proj_std,
                         bool gated)
    : gated_(gated) {
  TANDEM_CHECK(width > 0 && hidden > 0, "FeedForward: width (", width, ") and hidden (", hidden,
               ") must be positive");
  check_std(init_std, "FeedForward", "init_std");
  check_std(proj_std, "FeedForward", "proj_std");
  c_fc = register_module("c_fc", std::make_shared<Linear>(width, gated ? 2 * hidden : hidden, gen, bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(hidden, width, gen, bias));
  rescale_weight(*c_fc, init_std);
  rescale_weight(*c_proj, proj_std);
}

Tensor FeedForward::hidden_of(const Tensor& x) {
  Tensor gate_up = linear(x, c_fc->weight, c_fc->bias);  // the gate and the up projection from one product
  // Under selective recompute the activation is made again from the product's output, which its op keeps.
  return mark_for_recompute(swiglu(gate_up), [gate_up] { return swiglu(gate_up); });
}

Tensor FeedForward::forward(const Tensor& x) {
  const int64_t width = c_fc->weight.size(1);
  TANDEM_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == width, "FeedForward: input must be [..., ", width,
               "], got ", x.defined() ? x.str() : std::string("an undefined tensor"));
  if (gated_) return linear(hidden_of(x), c_proj->weight, c_proj->bias);
  return gelu_mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias);
}

Tensor FeedForward::forward_residual(const Tensor& x, const Tensor& residual) {
  const int64_t width = c_fc->weight.size(1);
  TANDEM_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == width, "FeedForward.forward_residual: input must be [..., ",
               width, "], got ", x.defined() ? x.str() : std::string("an undefined tensor"));
  if (gated_) return linear_residual(hidden_of(x), c_proj->weight, c_proj->bias, residual);
  return gelu_mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias, residual);
}

std::string FeedForward::describe() const {
  return detail::cat("FeedForward(", c_fc->weight.size(1), " -> ", c_proj->weight.size(1), " -> ",
                     c_proj->weight.size(0), gated_ ? ", SwiGLU)" : ", GELU tanh)");
}

// ---- TransformerBlock

TransformerBlock::TransformerBlock(int64_t width, int64_t heads, Generator& gen, const TransformerBlockOptions& opt)
    : width_(width), opt_(opt) {
  TANDEM_CHECK(width > 0 && heads > 0 && width % heads == 0, "TransformerBlock: width ", width,
               " must be a positive multiple of heads ", heads);
  TANDEM_CHECK(opt.dropout >= 0.0 && opt.dropout < 1.0, "TransformerBlock: dropout ", opt.dropout, " outside [0, 1)");
  TANDEM_CHECK(opt.mlp_ratio > 0, "TransformerBlock: mlp_ratio ", opt.mlp_ratio, " must be positive");
  TANDEM_CHECK(opt.residual_layers > 0, "TransformerBlock: residual_layers ", opt.residual_layers,
               " must be positive");
  TANDEM_CHECK(std::isfinite(opt.eps) && opt.eps > 0.0, "TransformerBlock: eps ", opt.eps, " must be positive");
  check_std(opt.init_std, "TransformerBlock", "init_std");
  const double proj_std =
      opt.scale_residual_init ? opt.init_std / std::sqrt(2.0 * static_cast<double>(opt.residual_layers)) : opt.init_std;
  const int64_t kv_heads = opt.kv_heads > 0 ? opt.kv_heads : heads;
  const bool attn_bias = opt.attention_bias.value_or(opt.bias), mlp_bias = opt.mlp_bias.value_or(opt.bias);
  auto norm = [&](const char* name, std::shared_ptr<LayerNorm>& ln, std::shared_ptr<RMSNorm>& rms) {
    if (opt.rms_norm)
      rms = register_module(name, std::make_shared<RMSNorm>(Shape{width}, opt.eps, true));
    else
      ln = register_module(name, std::make_shared<LayerNorm>(Shape{width}, opt.eps, true, opt.bias));
  };
  norm("ln_1", ln_1, rms_1);
  attn = register_module("attn", std::make_shared<SelfAttention>(width, heads, kv_heads, opt.rotary, gen, opt.causal,
                                                                 attn_bias, attn_bias, opt.dropout, opt.init_std,
                                                                 proj_std));
  norm("ln_2", ln_2, rms_2);
  const int64_t hidden = opt.mlp_hidden > 0 ? opt.mlp_hidden : opt.mlp_ratio * width;
  mlp = register_module("mlp", std::make_shared<FeedForward>(width, hidden, gen, mlp_bias, opt.init_std, proj_std,
                                                             opt.gated_mlp));
  gen_ = Generator(gen.next_below(uint64_t(1) << 62));
}

// Each norm feeds a product with a bias: under TANDEM_BIAS_FROM_PRODUCT=1 a LayerNorm's rows are padded for that
// product's weight gradient to take the bias gradient (ops/padded_rows.h).
Tensor TransformerBlock::norm_1(const Tensor& x, bool padded) {
  if (rms_1) return rms_1->forward(x);
  return padded && opt_.attention_bias.value_or(opt_.bias) ? ln_1->forward_padded(x) : ln_1->forward(x);
}

Tensor TransformerBlock::norm_2(const Tensor& x, bool padded) {
  if (rms_2) return rms_2->forward(x);
  return padded && opt_.mlp_bias.value_or(opt_.bias) && !opt_.gated_mlp ? ln_2->forward_padded(x) : ln_2->forward(x);
}

Tensor TransformerBlock::forward(const Tensor& x) {
  TANDEM_CHECK(x.defined() && x.dim() == 3 && x.size(2) == width_, "TransformerBlock: input must be [B, T, ", width_,
               "], got ", x.defined() ? x.str() : std::string("an undefined tensor"));
  const bool drop = is_training() && opt_.dropout > 0.0;
  // Under 16-bit precision the branches' products come out in 16 bits: they join the residual stream in
  // its own type (GPT keeps it in the activation type, so no conversion runs there).
  auto branch = [&](const Tensor& y) {
    Tensor r = drop ? dropout(y, opt_.dropout, true, gen_) : y;
    return r.dtype() == x.dtype() ? r : cast(r, x.dtype());
  };
  // Under selective recompute (an open RecomputeRegion) the norms' outputs are made again from their inputs,
  // which the norms keep.
  auto n1 = [&](const Tensor& in) { return mark_for_recompute(norm_1(in, true), [this, in] { return norm_1(in, true); }); };
  auto n2 = [&](const Tensor& in) { return mark_for_recompute(norm_2(in, true), [this, in] { return norm_2(in, true); }); };
  if (drop) {
    Tensor h = add(x, branch(attn->forward(n1(x))));
    return add(h, branch(mlp->forward(n2(h))));
  }
  // Without dropout each branch's output projection adds the residual itself.
  Tensor h = attn->forward_residual(n1(x), x);
  return mlp->forward_residual(n2(h), h);
}

Tensor TransformerBlock::forward_cached(const Tensor& x, KVCache& cache, int64_t capacity) {
  TANDEM_CHECK(x.defined() && x.dim() == 3 && x.size(2) == width_, "TransformerBlock.forward_cached: input must be [B, T, ",
               width_, "], got ", x.defined() ? x.str() : std::string("an undefined tensor"));
  NoGradGuard no_grad;
  auto in_stream = [&](const Tensor& y) { return y.dtype() == x.dtype() ? y : cast(y, x.dtype()); };
  Tensor h = add(x, in_stream(attn->forward_cached(norm_1(x, false), cache, capacity)));
  return add(h, in_stream(mlp->forward(norm_2(h, false))));
}

std::string TransformerBlock::describe() const {
  return detail::cat("TransformerBlock(", width_, ", ", attn->num_heads(), " heads",
                     attn->num_kv_heads() != attn->num_heads() ? detail::cat(", ", attn->num_kv_heads(), " key-value heads")
                                                               : std::string(),
                     opt_.rms_norm ? ", RMSNorm" : "", opt_.gated_mlp ? ", SwiGLU" : "", opt_.causal ? ", causal" : "",
                     opt_.dropout > 0 ? detail::cat(", dropout ", opt_.dropout) : std::string(),
                     opt_.bias ? "" : ", no bias", ")");
}

}  // namespace tandem::nn
