// The memory plan's model of a step: for each op of a GPT's or a Llama's forward, the tensors it keeps for its
// backward and what it holds while it runs, by dtype (see memory_plan_model.h); and the parameters the model has.
#include "cli/memory_plan_model.h"

#include <map>

#include "core/allocator.h"
#include "ops/padded_rows.h"
#include "tandem/error.h"

namespace tandem::cli {

namespace plan {

int64_t rounded(int64_t numel, DType dt) {
  if (numel <= 0) return 0;
  return static_cast<int64_t>(CachingAllocator::round_size(static_cast<size_t>(numel) * dtype_size(dt)));
}

int64_t bytes_of(const std::vector<Buf>& v) {
  int64_t n = 0;
  for (const Buf& b : v) n += b.bytes();
  return n;
}

Dtypes dtypes_of(const MemoryPlanSettings& s) {
  Dtypes d;
  d.act = s.device.is_cuda() ? activation_dtype(s.precision) : DType::f32;
  d.half = d.act != DType::f32;
  d.copies = d.half && s.param_copies && s.shard != dist::Shard::parameters && s.method != "partialUpdate";
  d.weight_saved = d.half && !d.copies;
  return d;
}

namespace {

class Builder {
 public:
  explicit Builder(const MemoryPlanSettings& s) : s_(s), d_(dtypes_of(s)) {}

  Model build() {
    m_.params = planned_parameters(s_);
    for (size_t i = 0; i < m_.params.size(); ++i) index_[m_.params[i].name] = static_cast<int>(i);
    n_ = s_.batch * s_.context;
    const bool llama = s_.model == "llama";
    c_ = llama ? s_.llama.width : s_.gpt.width;
    m_.stream = {n_ * c_, d_.act};
    const int64_t layers = llama ? s_.llama.layers : s_.gpt.layers;
    m_.stages.push_back(llama ? llama_embeddings() : gpt_embeddings());
    for (int64_t i = 0; i < layers; ++i) m_.stages.push_back(llama ? llama_block(i) : gpt_block(i));
    m_.stages.push_back(head(layers));
    if (llama) {
      const int64_t hd = s_.llama.width / s_.llama.heads;
      m_.persistent += 2 * rounded(s_.llama.context * hd, d_.act);  // the rotary tables, cos and sin
    }
    return m_;
  }

 private:
  int p(const std::string& name) const {
    auto it = index_.find(name);
    TANDEM_ASSERT(it != index_.end(), "memory plan: no parameter ", name);
    return it->second;
  }
  std::vector<int> ps(const std::string& prefix, std::initializer_list<const char*> names) const {
    std::vector<int> out;
    for (const char* n : names) {
      auto it = index_.find(prefix + n);
      if (it != index_.end()) out.push_back(it->second);
    }
    return out;
  }
  Buf act(int64_t numel) const { return {numel, d_.act}; }
  Buf f32(int64_t numel) const { return {numel, DType::f32}; }
  // What a product keeps of its weight [out, in]: a 16-bit copy of its own where no kept copy is read.
  std::vector<Buf> weight_kept(int64_t numel) const { return d_.weight_saved ? std::vector<Buf>{act(numel)} : std::vector<Buf>{}; }
  // A bias as a product reads it: a 16-bit copy made for the forward where no kept copy is read.
  std::vector<Buf> bias_copy(int64_t numel, bool has) const {
    return d_.weight_saved && has ? std::vector<Buf>{act(numel)} : std::vector<Buf>{};
  }
  std::vector<Buf> norm_stats(bool rms) const {
    if (rms) return {f32(n_)};
    return {f32(n_), f32(n_)};  // mean and rstd
  }
  std::vector<Buf> column_sums() const { return s_.column_sums ? std::vector<Buf>{f32(c_)} : std::vector<Buf>{}; }
  static void append(std::vector<Buf>& to, const std::vector<Buf>& more) { to.insert(to.end(), more.begin(), more.end()); }

  // Attention over the packed product qkv [B, T, (heads + 2 kv_heads) d] (its input), giving [B, T, width].
  Op attention(const std::string& who, int64_t heads, int64_t kv_heads, double dropout) const {
    const int64_t d = c_ / heads, qkv = (heads + 2 * kv_heads) * d, bh = s_.batch * heads, t = s_.context;
    Op op;
    op.what = who + "'s attention";
    if (s_.fused_attention) {
      // The fused kernels keep the packed product, the output and the log-sum-exp rows.
      op.saved.push_back(act(n_ * qkv));
      op.saved.push_back(act(n_ * c_));
      op.saved.push_back(f32(bh * t));
      op.bwd_out = {act(n_ * qkv)};
      return op;
    }
    // The math: the query, key and value heads in f32 (keys and values repeated for grouped queries), the
    // probabilities [B H, T, T], and the output laid out again for the projection after it.
    op.saved = {f32(n_ * c_), f32(n_ * c_), f32(n_ * c_), f32(bh * t * t), act(n_ * c_)};
    if (dropout > 0.0) {
      op.saved.push_back(f32(bh * t * t));  // the mask
      op.saved.push_back(f32(bh * t * t));  // the dropped probabilities
    }
    op.fwd_tmp.push_back(act(n_ * qkv));  // the packed product, read into the f32 heads
    op.fwd_tmp.push_back(f32(n_ * c_));  // the output before it is laid out as [B, T, width]
    op.bwd_tmp = {f32(n_ * c_), f32(bh * t * t), f32(n_ * c_), f32(n_ * c_), f32(n_ * c_)};
    if (d_.half) append(op.bwd_tmp, {act(n_ * c_), act(n_ * c_), act(n_ * c_)});
    op.bwd_out = {act(n_ * qkv)};
    return op;
  }

  // A residual branch's end: without dropout the product adds the residual itself; with it, dropout and an add.
  // The product's backward hands on the gradient of its input, `in_numel` elements.
  void branch_end(std::vector<Op>& ops, Op proj, const std::string& who, double dropout, int64_t in_numel) const {
    proj.bwd_out = {act(in_numel)};
    if (dropout == 0.0) {
      proj.passes_grad = true;
      ops.push_back(std::move(proj));
      return;
    }
    ops.push_back(std::move(proj));
    Op drop;
    drop.what = who + "'s dropout";
    drop.saved = {act(n_ * c_)};      // the mask
    drop.fwd_tmp = {act(n_ * c_)};    // the branch before dropout
    drop.bwd_out = {act(n_ * c_)};
    ops.push_back(std::move(drop));
    Op add;
    add.what = who + "'s residual";
    add.fwd_tmp = {act(n_ * c_)};     // the dropped branch
    add.passes_grad = true;           // to the residual, and (an alias) to the branch
    add.alias = true;
    ops.push_back(std::move(add));
  }

  Stage gpt_embeddings() const {
    Stage st;
    st.group = 0;
    Op e;
    e.what = "the embeddings";
    e.fwd_tmp = {f32(n_ * c_)};  // the rows of the table, before the positions are added
    if (d_.half) e.fwd_tmp.push_back(f32(n_ * c_));  // their sum, before the cast to the stream's type
    // Backward: the positions' gradient summed over the batch, the table's slice, the cast's f32 gradient.
    e.bwd_tmp = {f32(s_.context * c_), f32(s_.gpt.context * c_)};
    if (d_.half) e.bwd_tmp.push_back(f32(n_ * c_));
    e.params = {p("wpe.weight")};
    if (s_.gpt.dropout > 0.0) {
      e.fwd_tmp.push_back(act(n_ * c_));  // the stream before dropout
      Op drop;
      drop.what = "the embeddings' dropout";
      drop.saved = {act(n_ * c_)};
      drop.bwd_out = {act(n_ * c_)};
      st.ops = {std::move(e), std::move(drop)};
    } else {
      st.ops = {std::move(e)};
    }
    return st;
  }

  Stage llama_embeddings() const {
    Stage st;
    st.group = 0;
    Op e;
    e.what = "the embeddings";
    if (d_.half) {
      e.fwd_tmp = {f32(n_ * c_)};
      e.bwd_tmp = {f32(n_ * c_)};
    }
    if (!s_.llama.tied) e.params = {p("wte.weight")};
    st.ops = {std::move(e)};
    return st;
  }

  // Block i's stage (its layer group), taking the residual stream as its input.
  Stage block_stage(int64_t i) const {
    Stage st;
    st.group = static_cast<int>(i) + 1;
    st.block = true;
    st.input = m_.stream;
    return st;
  }

  // A block's first norm: it keeps its statistics (its input is the block's, kept as the stage's).
  Op first_norm(const std::string& who, const std::string& pre, bool rms) const {
    Op ln1;
    ln1.what = who + "'s first norm";
    ln1.saved = norm_stats(rms);
    ln1.bwd_tmp = column_sums();
    ln1.params = ps(pre + "ln_1.", {"weight", "bias"});  // an RMSNorm has no bias: ps leaves it out
    return ln1;
  }

  Stage gpt_block(int64_t i) const {
    const nn::GptConfig& g = s_.gpt;
    const std::string pre = "h." + std::to_string(i) + ".", who = "block " + std::to_string(i);
    const int64_t f = 4 * c_;
    const bool pad = s_.bias_from_product && g.bias;  // layer norms write padded rows for the biased products
    const int64_t ld = pad ? ops::padded_ld(c_) : c_;
    Stage st = block_stage(i);
    Op ln1 = first_norm(who, pre, /*rms=*/false);
    Op qkv;
    qkv.what = who + "'s query-key-value product";
    qkv.saved = {act(n_ * ld)};
    qkv.remade = {act(n_ * ld)};  // the first norm's output
    append(qkv.saved, weight_kept(3 * c_ * c_));
    qkv.fwd_tmp = bias_copy(3 * c_, g.bias);
    if (pad) qkv.bwd_tmp = {f32(3 * c_ * ld)};
    qkv.bwd_out = {act(n_ * c_)};
    qkv.params = ps(pre + "attn.c_attn.", {"weight", "bias"});
    Op proj;
    proj.what = who + "'s attention projection";
    proj.saved = weight_kept(c_ * c_);
    proj.fwd_tmp = bias_copy(c_, g.bias);
    proj.params = ps(pre + "attn.c_proj.", {"weight", "bias"});
    st.ops = {std::move(ln1), std::move(qkv), attention(who, g.heads, g.heads, g.dropout)};
    branch_end(st.ops, std::move(proj), who + "'s attention", g.dropout, n_ * c_);
    Op ln2;
    ln2.what = who + "'s second norm";
    ln2.saved = {act(n_ * c_)};  // its input, the stream after attention
    append(ln2.saved, norm_stats(false));
    ln2.bwd_tmp = column_sums();
    ln2.params = ps(pre + "ln_2.", {"weight", "bias"});
    st.ops.push_back(std::move(ln2));
    Op mlp;
    mlp.what = who + "'s MLP";
    // Its input, the GELU's input and output; each product's own weight copy where none is kept.
    mlp.saved = {act(n_ * ld), act(n_ * f), act(n_ * f)};
    mlp.remade = {act(n_ * ld)};  // the second norm's output
    append(mlp.saved, weight_kept(f * c_));
    append(mlp.saved, weight_kept(c_ * f));
    append(mlp.fwd_tmp, bias_copy(f, g.bias));
    append(mlp.fwd_tmp, bias_copy(c_, g.bias));
    mlp.bwd_tmp = {act(n_ * f)};  // the gradient at the GELU's input
    if (pad) {
      mlp.bwd_tmp.push_back(f32(f * ld));  // the first weight's gradient with its bias's column
    } else if (g.bias && d_.half) {
      mlp.bwd_tmp.push_back(act(f));  // the first bias's gradient in the product's type
    }
    mlp.params = ps(pre + "mlp.", {"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"});
    branch_end(st.ops, std::move(mlp), who + "'s MLP", g.dropout, n_ * c_);
    return st;
  }

  Stage llama_block(int64_t i) const {
    const nn::LlamaConfig& l = s_.llama;
    const std::string pre = "h." + std::to_string(i) + ".", who = "block " + std::to_string(i);
    const int64_t d = c_ / l.heads, qkv_w = c_ + 2 * l.kv_heads * d, f = l.mlp_hidden;
    Stage st = block_stage(i);
    Op ln1 = first_norm(who, pre, /*rms=*/true);
    Op qkv;
    qkv.what = who + "'s query-key-value product";
    qkv.saved = {act(n_ * c_)};
    qkv.remade = {act(n_ * c_)};  // the first norm's output
    append(qkv.saved, weight_kept(qkv_w * c_));
    qkv.fwd_tmp = bias_copy(qkv_w, l.attention_bias);
    qkv.bwd_out = {act(n_ * c_)};
    qkv.params = ps(pre + "attn.c_attn.", {"weight", "bias"});
    Op rope;
    rope.what = who + "'s rotary embedding";
    rope.fwd_tmp = {act(n_ * qkv_w)};  // the product before rotation (attention keeps the rotated one)
    rope.bwd_out = {act(n_ * qkv_w)};
    Op proj;
    proj.what = who + "'s attention projection";
    proj.saved = weight_kept(c_ * c_);
    proj.fwd_tmp = bias_copy(c_, l.attention_bias);
    proj.params = ps(pre + "attn.c_proj.", {"weight", "bias"});
    st.ops = {std::move(ln1), std::move(qkv), std::move(rope), attention(who, l.heads, l.kv_heads, l.dropout)};
    branch_end(st.ops, std::move(proj), who + "'s attention", l.dropout, n_ * c_);
    Op ln2;
    ln2.what = who + "'s second norm";
    ln2.saved = {act(n_ * c_)};
    append(ln2.saved, norm_stats(true));
    ln2.bwd_tmp = column_sums();
    ln2.params = ps(pre + "ln_2.", {"weight"});
    Op up;
    up.what = who + "'s gate and up product";
    up.saved = {act(n_ * c_)};
    up.remade = {act(n_ * c_)};  // the second norm's output
    append(up.saved, weight_kept(2 * f * c_));
    up.fwd_tmp = bias_copy(2 * f, l.mlp_bias);
    up.bwd_out = {act(n_ * c_)};
    up.params = ps(pre + "mlp.c_fc.", {"weight", "bias"});
    Op glu;
    glu.what = who + "'s SwiGLU";
    glu.saved = {act(n_ * 2 * f)};
    glu.bwd_out = {act(n_ * 2 * f)};
    Op down;
    down.what = who + "'s MLP";
    down.saved = {act(n_ * f)};
    down.remade = {act(n_ * f)};  // the SwiGLU's output
    append(down.saved, weight_kept(c_ * f));
    down.fwd_tmp = bias_copy(c_, l.mlp_bias);
    down.params = ps(pre + "mlp.c_proj.", {"weight", "bias"});
    st.ops.push_back(std::move(ln2));
    st.ops.push_back(std::move(up));
    st.ops.push_back(std::move(glu));
    branch_end(st.ops, std::move(down), who + "'s MLP", l.dropout, n_ * f);
    return st;
  }

  Stage head(int64_t layers) {
    const bool llama = s_.model == "llama";
    const int64_t v = llama ? s_.llama.vocab : s_.gpt.vocab;
    const bool tied = !llama || s_.llama.tied;
    Stage st;
    st.group = static_cast<int>(layers) + 1;
    Op norm;
    norm.what = "the final norm";
    norm.saved = {m_.stream};  // its input, the last block's output
    append(norm.saved, norm_stats(llama));
    norm.bwd_tmp = column_sums();
    norm.bwd_out = {act(n_ * c_)};
    norm.params = ps("ln_f.", {"weight", "bias"});
    // The loss takes the head's product chunk by chunk (linear_cross_entropy): it keeps the gradients of its
    // input and of the output weight, made in the forward, and a chunk of logits at a time.
    const DType cdt = d_.act;
    const int64_t row_bytes = std::max<int64_t>(v * static_cast<int64_t>(dtype_size(cdt)), 1);
    int64_t rows = std::max<int64_t>(1, std::min(n_, s_.logit_chunk_bytes / row_bytes));
    const int64_t chunks = (n_ + rows - 1) / rows;
    rows = std::min(n_, ((n_ + chunks - 1) / chunks + 63) / 64 * 64);
    Op loss;
    loss.what = chunks > 1 ? "the loss (logits in " + std::to_string(chunks) + " chunks)" : "the loss (its logits)";
    loss.saved = {Buf{n_ * c_, cdt}, f32(v * c_), f32(1)};
    loss.fwd_tmp = {act(n_ * c_), Buf{rows * v, cdt}, f32(n_), f32(n_)};
    if (d_.weight_saved) loss.fwd_tmp.push_back(act(v * c_));
    loss.bwd_tmp = {f32(1), f32(1)};
    loss.bwd_out = {act(n_ * c_)};
    if (tied) {
      loss.bwd_keep = {f32(v * c_)};  // the table's gradient waits for the embeddings' share
      m_.tied_table = p("wte.weight");
    } else {
      loss.bwd_tmp.push_back(f32(v * c_));
      loss.params = {p("lm_head.weight")};
    }
    st.ops = {std::move(norm), std::move(loss)};
    return st;
  }

  const MemoryPlanSettings& s_;
  Dtypes d_;
  Model m_;
  std::map<std::string, int> index_;
  int64_t n_ = 0, c_ = 0;
};

}  // namespace

Model build_model(const MemoryPlanSettings& s) { return Builder(s).build(); }

}  // namespace plan

std::vector<PlannedParam> planned_parameters(const MemoryPlanSettings& s) {
  std::vector<PlannedParam> out;
  auto add = [&](const std::string& name, Shape shape, std::vector<int> groups) {
    out.push_back({name, std::move(shape), std::move(groups)});
  };
  if (s.model == "llama") {
    const nn::LlamaConfig& l = s.llama;
    nn::check_llama_config(l);
    const int64_t w = l.width, d = w / l.heads, qkv = w + 2 * l.kv_heads * d, head = static_cast<int>(l.layers) + 1;
    add("wte.weight", {l.vocab, w}, l.tied ? std::vector<int>{0, static_cast<int>(head)} : std::vector<int>{0});
    for (int64_t i = 0; i < l.layers; ++i) {
      const std::string p = "h." + std::to_string(i) + ".";
      const std::vector<int> g{static_cast<int>(i) + 1};
      add(p + "ln_1.weight", {w}, g);
      add(p + "attn.c_attn.weight", {qkv, w}, g);
      if (l.attention_bias) add(p + "attn.c_attn.bias", {qkv}, g);
      add(p + "attn.c_proj.weight", {w, w}, g);
      if (l.attention_bias) add(p + "attn.c_proj.bias", {w}, g);
      add(p + "ln_2.weight", {w}, g);
      add(p + "mlp.c_fc.weight", {2 * l.mlp_hidden, w}, g);
      if (l.mlp_bias) add(p + "mlp.c_fc.bias", {2 * l.mlp_hidden}, g);
      add(p + "mlp.c_proj.weight", {w, l.mlp_hidden}, g);
      if (l.mlp_bias) add(p + "mlp.c_proj.bias", {w}, g);
    }
    add("ln_f.weight", {w}, {static_cast<int>(head)});
    if (!l.tied) add("lm_head.weight", {l.vocab, w}, {static_cast<int>(head)});
    return out;
  }
  TANDEM_CHECK(s.model == "gpt", "memory plan: model ", s.model, " (gpt or llama)");
  const nn::GptConfig& g = s.gpt;
  nn::check_gpt_config(g);
  const int64_t w = g.width;
  const int head = static_cast<int>(g.layers) + 1;
  add("wte.weight", {g.vocab, w}, {0, head});
  add("wpe.weight", {g.context, w}, {0});
  for (int64_t i = 0; i < g.layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const std::vector<int> gr{static_cast<int>(i) + 1};
    auto linear = [&](const std::string& name, int64_t out_f, int64_t in_f) {
      add(p + name + ".weight", {out_f, in_f}, gr);
      if (g.bias) add(p + name + ".bias", {out_f}, gr);
    };
    auto norm = [&](const std::string& name) {
      add(p + name + ".weight", {w}, gr);
      if (g.bias) add(p + name + ".bias", {w}, gr);
    };
    norm("ln_1");
    linear("attn.c_attn", 3 * w, w);
    linear("attn.c_proj", w, w);
    norm("ln_2");
    linear("mlp.c_fc", 4 * w, w);
    linear("mlp.c_proj", w, 4 * w);
  }
  add("ln_f.weight", {w}, {head});
  if (g.bias) add("ln_f.bias", {w}, {head});
  return out;
}

}  // namespace tandem::cli
