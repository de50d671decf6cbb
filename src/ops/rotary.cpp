// Rotary position embeddings in Hugging Face's rotate-half layout (Llama, Qwen, Mistral): the tables, the
// rotation written with ops (its backward is theirs, on every backend), and the rotation of the query and key
// heads of a packed projection in one kernel (the backend's rotary_packed, forward and backward), which keeps
// nothing but the tables for its backward.
#include <cmath>

#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

std::pair<Tensor, Tensor> rotary_tables(int64_t head_dim, int64_t positions, double theta, const RopeScaling& scaling,
                                        DType dtype, Device device) {
  TANDEM_CHECK(head_dim > 0 && head_dim % 2 == 0, "rotary_tables: head_dim ", head_dim, " must be positive and even");
  TANDEM_CHECK(positions >= 0, "rotary_tables: positions ", positions, " must not be negative");
  TANDEM_CHECK(std::isfinite(theta) && theta > 0.0, "rotary_tables: theta ", theta, " must be positive");
  const int64_t half = head_dim / 2;
  // transformers' default: 1 / theta^(arange(0, d, 2) / d), in f32.
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(theta), e);
  }
  if (scaling.factor > 0.0) {
    // Llama 3.1's rescaling: long wavelengths divided by factor, short ones kept, those between blended.
    TANDEM_CHECK(scaling.high_freq_factor > scaling.low_freq_factor && scaling.low_freq_factor > 0.0 &&
                     scaling.original_context > 0,
                 "rotary_tables: llama3 rope_scaling needs high_freq_factor > low_freq_factor > 0 and a positive "
                 "original_max_position_embeddings");
    const float factor = static_cast<float>(scaling.factor), low = static_cast<float>(scaling.low_freq_factor),
                high = static_cast<float>(scaling.high_freq_factor),
                old = static_cast<float>(scaling.original_context);
    const float low_wavelen = old / low, high_wavelen = old / high;
    for (float& f : inv) {
      const float wavelen = 2.0f * static_cast<float>(M_PI) / f;
      float scaled = wavelen > low_wavelen ? f / factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const float smooth = (old / wavelen - low) / (high - low);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f = scaled;
    }
  }
  std::vector<double> c(static_cast<size_t>(positions * head_dim)), s(c.size());
  for (int64_t t = 0; t < positions; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(static_cast<float>(t) * inv[static_cast<size_t>(i)]);
      const size_t a = static_cast<size_t>(t * head_dim + i), b = a + static_cast<size_t>(half);
      c[a] = c[b] = std::cos(angle);
      s[a] = s[b] = std::sin(angle);
    }
  Tensor ct = Tensor::from_vector(c, {positions, head_dim}), st = Tensor::from_vector(s, {positions, head_dim});
  return {ct.to(dtype).to(device), st.to(dtype).to(device)};
}

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const char* op = "rotary_embedding";
  TANDEM_CHECK(x.defined() && x.dim() >= 2, op, ": x must be [..., T, d], got ",
               x.defined() ? x.str() : std::string("an undefined tensor"));
  const int64_t t = x.size(-2), d = x.size(-1);
  TANDEM_CHECK(d % 2 == 0, op, ": the head size ", d, " of x ", x.str(), " must be even");
  TANDEM_CHECK(cos.defined() && sin.defined() && cos.dim() == 2 && cos.shape() == sin.shape() && cos.size(0) == t &&
                   cos.size(1) == d,
               op, ": cos and sin must be [", t, ", ", d, "] for x ", x.str(), ", got ",
               cos.defined() ? cos.str() : std::string("none"), " and ", sin.defined() ? sin.str() : std::string("none"));
  TANDEM_CHECK(cos.dtype() == x.dtype() && sin.dtype() == x.dtype(), op, ": cos ", cos.str(), " and sin ", sin.str(),
               " must be of x's dtype ", dtype_name(x.dtype()));
  check_same_device(x, cos, op);
  check_same_device(x, sin, op);
  const int64_t half = d / 2, last = x.dim() - 1;
  Tensor rotated = concat({neg(slice(x, last, half, half)), slice(x, last, 0, half)}, last);
  return add(mul(x, cos), mul(rotated, sin));
}

Tensor rotary_packed(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t heads, int64_t kv_heads,
                     int64_t start, const Tensor& positions) {
  const char* op = "rotary_packed";
  check_dim(qkv, 3, op, "qkv");
  check_floating(qkv, op, "qkv");
  TANDEM_CHECK(heads > 0 && kv_heads > 0, op, ": heads (", heads, ") and kv_heads (", kv_heads, ") must be positive");
  const int64_t b = qkv.size(0), t = qkv.size(1), parts = heads + 2 * kv_heads;
  TANDEM_CHECK(qkv.size(2) % parts == 0 && (qkv.size(2) / parts) % 2 == 0 && qkv.size(2) > 0, op, ": qkv ", qkv.str(),
               " must hold ", heads, " query, ", kv_heads, " key and ", kv_heads,
               " value heads of one even head size side by side along dimension 2 (its extent a positive multiple of ",
               "2 x ", parts, ")");
  const int64_t d = qkv.size(2) / parts;
  TANDEM_CHECK(start >= 0, op, ": start ", start, " must not be negative");
  TANDEM_CHECK(cos.defined() && sin.defined() && cos.dim() == 2 && cos.shape() == sin.shape() && cos.size(1) == d &&
                   cos.size(0) >= start + t,
               op, ": cos and sin must be [P, ", d, "] with P >= start + T = ", start + t, " for qkv ", qkv.str(),
               ", got ", cos.defined() ? cos.str() : std::string("none"), " and ",
               sin.defined() ? sin.str() : std::string("none"));
  TANDEM_CHECK(cos.dtype() == qkv.dtype() && sin.dtype() == qkv.dtype(), op, ": cos ", cos.str(), " and sin ",
               sin.str(), " must be of qkv's dtype ", dtype_name(qkv.dtype()));
  check_same_device(qkv, cos, op);
  check_same_device(qkv, sin, op);
  Tensor pos;
  if (positions.defined()) {
    TANDEM_CHECK(start == 0, op, ": positions and a start (", start, ") cannot be given together");
    TANDEM_CHECK(positions.dtype() == DType::i32 && positions.dim() == 2 && positions.size(0) == b &&
                     positions.size(1) == t,
                 op, ": positions must be i32 [", b, ", ", t, "] for qkv ", qkv.str(), ", got ", positions.str());
    check_same_device(qkv, positions, op);
    pos = positions.contiguous().detach();
  }
  // The composition it stands for: the query and key heads viewed as [B, heads, T, d], rotated, and put back.
  auto composed = [&] {
    // Recorded: the tables may take a gradient. With positions, each row's table rows [B, 1, T, d].
    const Tensor c = pos.defined() ? unsqueeze(embedding(cos, pos), {1}) : slice(cos, 0, start, t),
                 s = pos.defined() ? unsqueeze(embedding(sin, pos), {1}) : slice(sin, 0, start, t);
    const int64_t half = d / 2;
    std::vector<Tensor> qkv_parts = split(qkv, {heads * d, kv_heads * d, kv_heads * d}, 2);
    auto rotate = [&](const Tensor& y, int64_t h) {
      Tensor x = permute(reshape(y, {b, t, h, d}), {0, 2, 1, 3});
      Tensor r = pos.defined() ? add(mul(x, c), mul(concat({neg(slice(x, 3, half, half)), slice(x, 3, 0, half)}, 3), s))
                               : rotary_embedding(x, c, s);
      return reshape(permute(r, {0, 2, 1, 3}), {b, t, h * d});
    };
    return concat({rotate(qkv_parts[0], heads), rotate(qkv_parts[1], kv_heads), qkv_parts[2]}, 2);
  };
  // Tables that take a gradient get it from the composition.
  if (cos.requires_grad() || sin.requires_grad()) return composed();
  backend::RotaryGeom g;
  g.batch = b;
  g.t = t;
  g.rotated = heads + kv_heads;
  g.copied = kv_heads;
  g.d = d;
  g.start = start;
  g.positions = pos;
  const Tensor x = to_dense(qkv, qkv.dtype(), false).detach(), c = cos.contiguous().detach(),
               s = sin.contiguous().detach();
  Tensor y = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
  if (!be(qkv).rotary_packed(x, c, s, g, y)) return composed();
  return record_op(y, {qkv}, op, [c, s, g](const Tensor& grad) {
    // The gradient of a rotation is its transpose; the value heads' passes through.
    backend::RotaryGeom gt = g;
    gt.transpose = true;
    const Tensor gd = to_dense(grad, c.dtype(), false);
    Tensor dx = grad_buffer(0, gd.shape(), gd.dtype(), gd.device());
    TANDEM_CHECK(be(gd).rotary_packed(gd, c, s, gt, dx), "rotary_packed backward: the backend refused ", gd.str(),
                 ", whose forward it took");
    return std::vector<Tensor>{dx};
  });
}

}  // namespace tandem
