// Recurrent networks (RNN with tanh or ReLU, LSTM, GRU): multi-layer, optionally bidirectional.
//
// Two ways to compute the same network, on one flat weight of one layout (see tandem::rnn in ops.h):
//  - fused: the backend's recurrent kernels (cuDNN's on CUDA, for f32 and f16), recorded as one op whose
//    output packs y, hy and cy; the three are handed out as pieces of it;
//  - composed: per layer and direction, one product for the inputs of every step, then per step the
//    recurrent product and the cell's activations, all recorded ops (so autograd derives the backward).
//    It runs wherever those ops do and serves as the reference the fused kernels are tested against.
// Dropout between layers uses tandem's dropout in both, layer by layer, so the two agree under it too.
#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"
#include "tandem/precision.h"

namespace tandem {

using namespace ops;

int64_t rnn_gate_count(RnnMode mode) {
  switch (mode) {
    case RnnMode::RnnTanh:
    case RnnMode::RnnRelu: return 1;
    case RnnMode::Lstm: return 4;
    case RnnMode::Gru: return 3;
  }
  return 1;
}

int64_t rnn_weight_size(RnnMode mode, int64_t input_size, int64_t hidden_size, int64_t num_layers, bool bidirectional,
                        bool bias) {
  const int64_t g = rnn_gate_count(mode), h = hidden_size, d = bidirectional ? 2 : 1;
  int64_t total = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    const int64_t il = l == 0 ? input_size : d * h;
    total += d * (g * h * (il + h) + (bias ? 2 * g * h : 0));
  }
  return total;
}

namespace {

const char* mode_name(RnnMode m) {
  switch (m) {
    case RnnMode::RnnTanh: return "an RNN (tanh)";
    case RnnMode::RnnRelu: return "an RNN (relu)";
    case RnnMode::Lstm: return "an LSTM";
    case RnnMode::Gru: return "a GRU";
  }
  return "a recurrent network";
}

// Elements [start, start + len) of dimension 0 of the contiguous x, viewed as `shape`. Its gradient is
// added in place into the gradient x gathers (or a zeroed one), so that taking many pieces of a tensor
// costs no zero-padded copy of the whole per piece.
Tensor piece(const Tensor& x, int64_t start, int64_t len, const Shape& shape) {
  TANDEM_ASSERT(x.is_contiguous(), "rnn piece of ", x.str());
  Tensor y = x.detach().narrow(0, start, len).view(shape);
  if (!x.requires_grad() || !grad_enabled()) return y;
  const Shape full = x.shape();
  const DType dt = x.dtype();
  const Device dev = x.device();
  return record_op(y, {x}, "rnn_piece", [full, dt, dev, start, len](const Tensor& g) {
    auto fits = [&](const Tensor& t) {
      return t.defined() && t.shape() == full && t.dtype() == dt && t.device() == dev && t.is_contiguous();
    };
    Tensor acc = grad_add_target(0);
    if (!fits(acc)) acc = grad_destination(0);  // a leaf's buffer of zeros that only this op feeds
    if (!fits(acc)) acc = Tensor::zeros(full, dt, dev);
    Tensor part = acc.narrow(0, start, len);
    Tensor gc = g.contiguous().view(part.shape());
    if (part.numel() > 0) be(part).binary(backend::Binary::Add, part, gc, part);
    return std::vector<Tensor>{acc};
  });
}

// x in another dtype, recorded (the gradient returns in x's dtype).
Tensor in_dtype(const Tensor& x, DType dt) {
  if (!x.defined() || x.dtype() == dt) return x;
  const DType from = x.dtype();
  return record_op(x.to(dt), {x}, "rnn_cast", [from](const Tensor& g) { return std::vector<Tensor>{g.to(from)}; });
}

// x itself when contiguous, else a recorded contiguous copy.
Tensor dense(const Tensor& x) { return !x.defined() || x.is_contiguous() ? x : reshape(x, x.shape()); }

struct Dims {
  int64_t seq, batch, input, hidden, layers, dirs, gates;
};

struct Pieces {
  Tensor w_ih, w_hh, b_ih, b_hh;
};

// The weights of layer l, direction d, starting at *off of the flat weight (advanced past them).
Pieces layer_pieces(const Tensor& w, int64_t& off, int64_t in, const Dims& s, bool bias) {
  const int64_t gh = s.gates * s.hidden;
  Pieces p;
  p.w_ih = piece(w, off, gh * in, {gh, in});
  off += gh * in;
  p.w_hh = piece(w, off, gh * s.hidden, {gh, s.hidden});
  off += gh * s.hidden;
  if (bias) {
    p.b_ih = piece(w, off, gh, {gh});
    off += gh;
    p.b_hh = piece(w, off, gh, {gh});
    off += gh;
  }
  return p;
}

// One direction of one layer over xw [T, N, G H] (the input products, bias included): the outputs of
// every step, in time order, and the final states.
void run_direction(RnnMode mode, const Tensor& xw, const Pieces& w, Tensor h, Tensor c, bool reverse, const Dims& s,
                   std::vector<Tensor>& outs, Tensor& h_last, Tensor& c_last) {
  const int64_t T = s.seq, N = s.batch, H = s.hidden, gh = s.gates * H;
  outs.assign(static_cast<size_t>(T), Tensor());
  for (int64_t k = 0; k < T; ++k) {
    const int64_t t = reverse ? T - 1 - k : k;
    Tensor xt = piece(xw, t, 1, {N, gh});
    Tensor hh = linear(h, w.w_hh, w.b_hh);
    switch (mode) {
      case RnnMode::RnnTanh: h = tanh(add(xt, hh)); break;
      case RnnMode::RnnRelu: h = relu(add(xt, hh)); break;
      case RnnMode::Lstm: {
        Tensor gates = add(xt, hh);
        Tensor i = sigmoid(slice(gates, 1, 0, H)), f = sigmoid(slice(gates, 1, H, H));
        Tensor g = tanh(slice(gates, 1, 2 * H, H)), o = sigmoid(slice(gates, 1, 3 * H, H));
        c = add(mul(f, c), mul(i, g));
        h = mul(o, tanh(c));
        break;
      }
      case RnnMode::Gru: {
        Tensor r = sigmoid(add(slice(xt, 1, 0, H), slice(hh, 1, 0, H)));
        Tensor z = sigmoid(add(slice(xt, 1, H, H), slice(hh, 1, H, H)));
        Tensor n = tanh(add(slice(xt, 1, 2 * H, H), mul(r, slice(hh, 1, 2 * H, H))));
        h = add(n, mul(z, sub(h, n)));  // (1 - z) n + z h
        break;
      }
    }
    outs[static_cast<size_t>(t)] = reshape(h, {1, N, H});
  }
  h_last = h;
  c_last = c;
}

// The network of per-step ops, over time-major x [T, N, I].
RnnResult composed(const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx, const RnnOptions& o,
                   const Dims& s, Generator* gen) {
  const int64_t T = s.seq, N = s.batch, H = s.hidden;
  const bool lstm = o.mode == RnnMode::Lstm;
  Tensor in = x;
  int64_t off = 0;
  std::vector<Tensor> hy_parts, cy_parts;
  for (int64_t l = 0; l < s.layers; ++l) {
    const int64_t il = l == 0 ? s.input : s.dirs * H;
    std::vector<Tensor> dir_y;
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t p = l * s.dirs + d;
      Pieces lw = layer_pieces(w, off, il, s, o.bias);
      Tensor xw = reshape(linear(reshape(in, {T * N, il}), lw.w_ih, lw.b_ih), {T, N, s.gates * H});
      Tensor h0 = hx.defined() ? piece(hx, p, 1, {N, H}) : Tensor::zeros({N, H}, x.dtype(), x.device());
      Tensor c0;
      if (lstm) c0 = cx.defined() ? piece(cx, p, 1, {N, H}) : Tensor::zeros({N, H}, x.dtype(), x.device());
      std::vector<Tensor> outs;
      Tensor h_last, c_last;
      run_direction(o.mode, xw, lw, h0, c0, d == 1, s, outs, h_last, c_last);
      dir_y.push_back(concat(outs, 0));
      hy_parts.push_back(reshape(h_last, {1, N, H}));
      if (lstm) cy_parts.push_back(reshape(c_last, {1, N, H}));
    }
    in = s.dirs == 2 ? concat(dir_y, 2) : dir_y[0];
    // The masks are drawn in the input's layout, as the fused path draws them.
    if (l + 1 < s.layers && o.training && o.dropout > 0.0)
      in = o.batch_first ? permute(dropout(permute(in, {1, 0, 2}), o.dropout, true, *gen), {1, 0, 2})
                         : dropout(in, o.dropout, true, *gen);
  }
  return {in, concat(hy_parts, 0), lstm ? concat(cy_parts, 0) : Tensor()};
}

// One call of the backend's fused kernels for the whole network described by s (no dropout inside).
RnnResult fused(const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx, const RnnOptions& o,
                const Dims& s, int math) {
  backend::RnnGeom g;
  g.mode = o.mode;
  g.input = s.input;
  g.hidden = s.hidden;
  g.layers = s.layers;
  g.seq = s.seq;
  g.batch = s.batch;
  g.bidirectional = s.dirs == 2;
  g.bias = o.bias;
  g.batch_first = o.batch_first;
  g.dtype = x.dtype();
  g.math = math;
  const bool lstm = o.mode == RnnMode::Lstm;
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  const Tensor hxc = hx.defined() ? hx.contiguous() : Tensor(), cxc = cx.defined() ? cx.contiguous() : Tensor();
  const bool need_x = x.requires_grad(), need_w = w.requires_grad(), need_h = hx.defined() && hx.requires_grad(),
             need_c = cx.defined() && cx.requires_grad();
  const bool train = grad_enabled() && (need_x || need_w || need_h || need_c);
  const int64_t T = s.seq, N = s.batch, H = s.hidden, LD = s.layers * s.dirs;
  const Shape y_shape = o.batch_first ? Shape{N, T, s.dirs * H} : Shape{T, N, s.dirs * H};
  const Shape h_shape{LD, N, H};
  const int64_t ny = T * N * s.dirs * H, nh = LD * N * H, nc = lstm ? nh : 0;
  Tensor packed = Tensor::empty({ny + nh + nc}, x.dtype(), x.device());
  Tensor y = packed.narrow(0, 0, ny).view(y_shape), hy = packed.narrow(0, ny, nh).view(h_shape);
  Tensor cy = lstm ? packed.narrow(0, ny + nh, nc).view(h_shape) : Tensor();
  Tensor reserve;
  be(x).rnn_forward(g, xc, wc, hxc, cxc, train, y, hy, cy, reserve);
  if (!train) return {y, hy, cy};
  const Shape x_shape = xc.shape(), w_shape = wc.shape();
  const Tensor sy = y;  // a view of the packed output's storage, not its graph node
  packed = record_op(packed, {x, w, hx, cx}, "rnn",
                     [g, xc, wc, hxc, cxc, sy, reserve, ny, nh, nc, y_shape, h_shape, x_shape, w_shape, need_x, need_w,
                      need_h, need_c](const Tensor& grad) {
    Tensor gc = grad.contiguous();
    Tensor dy = gc.narrow(0, 0, ny).view(y_shape), dhy = gc.narrow(0, ny, nh).view(h_shape);
    Tensor dcy = nc > 0 ? gc.narrow(0, ny + nh, nc).view(h_shape) : Tensor();
    Tensor dx = Tensor::empty(x_shape, xc.dtype(), xc.device());
    Tensor dw = need_w ? grad_buffer(1, w_shape, wc.dtype(), wc.device()) : Tensor();
    Tensor dhx = need_h ? Tensor::empty(h_shape, xc.dtype(), xc.device()) : Tensor();
    Tensor dcx = need_c ? Tensor::empty(h_shape, xc.dtype(), xc.device()) : Tensor();
    be(dx).rnn_backward(g, xc, wc, hxc, cxc, sy, reserve, dy, dhy, dcy, dx, dw, dhx, dcx);
    return std::vector<Tensor>{need_x ? dx : Tensor(), dw, dhx, dcx};
  });
  return {piece(packed, 0, ny, y_shape), piece(packed, ny, nh, h_shape),
          lstm ? piece(packed, ny + nh, nc, h_shape) : Tensor()};
}

void check_state(const Tensor& t, const Tensor& x, const Dims& s, const char* what) {
  if (!t.defined()) return;
  const Shape want{s.layers * s.dirs, s.batch, s.hidden};
  TANDEM_CHECK(t.shape() == want, "rnn: the initial ", what, " ", t.str(), " must be ", shape_str(want),
               " ([layers * directions, batch, hidden]) for the input ", x.str());
  TANDEM_CHECK(t.dtype() == x.dtype() && t.device() == x.device(), "rnn: the initial ", what, " ", t.str(),
               " differs in dtype or device from the input ", x.str());
}

}  // namespace

RnnResult rnn(const Tensor& x_in, const Tensor& weight_in, const Tensor& hx_in, const Tensor& cx_in,
              const RnnOptions& o, Generator* gen) {
  check_dim(x_in, 3, "rnn", "input");
  check_floating(x_in, "rnn", "input");
  check_defined(weight_in, "rnn", "weight");
  TANDEM_CHECK(o.hidden_size >= 1 && o.num_layers >= 1, "rnn: hidden_size (", o.hidden_size, ") and num_layers (",
               o.num_layers, ") must be positive");
  TANDEM_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, "rnn: dropout ", o.dropout, " outside [0, 1)");
  TANDEM_CHECK(weight_in.dtype() == x_in.dtype() && weight_in.device() == x_in.device(), "rnn: weight ",
               weight_in.str(), " differs in dtype or device from the input ", x_in.str());
  TANDEM_CHECK(weight_in.dim() == 1, "rnn: the weight must be flat (1-D), got ", weight_in.str());
  Dims s{};
  s.seq = x_in.size(o.batch_first ? 1 : 0);
  s.batch = x_in.size(o.batch_first ? 0 : 1);
  s.input = x_in.size(2);
  s.hidden = o.hidden_size;
  s.layers = o.num_layers;
  s.dirs = o.bidirectional ? 2 : 1;
  s.gates = rnn_gate_count(o.mode);
  const int64_t want = rnn_weight_size(o.mode, s.input, s.hidden, s.layers, o.bidirectional, o.bias);
  TANDEM_CHECK(weight_in.numel() == want, "rnn: weight ", weight_in.str(), " has ", weight_in.numel(),
               " elements, but ", mode_name(o.mode), " of input size ", s.input, ", hidden size ", s.hidden, ", ",
               s.layers, " layer(s)", o.bidirectional ? ", bidirectional" : "", o.bias ? "" : ", without biases",
               " needs ", want);
  TANDEM_CHECK(!cx_in.defined() || o.mode == RnnMode::Lstm, "rnn: an initial cell state is given to ",
               mode_name(o.mode), "; only an LSTM has one");
  check_state(hx_in, x_in, s, "hidden state");
  check_state(cx_in, x_in, s, "cell state");
  const bool drop = o.training && o.dropout > 0.0 && s.layers > 1;
  TANDEM_CHECK(!drop || gen != nullptr, "rnn: dropout between layers in training needs a random generator");
  const bool lstm = o.mode == RnnMode::Lstm;

  // Under a 16-bit precision on CUDA, f32 tensors are computed in 16-bit (as linear does).
  const Precision prec = current_precision();
  const DType cdt = compute_dtype(x_in.device(), prec, x_in.dtype());
  Tensor x = in_dtype(x_in, cdt), w = in_dtype(weight_in, cdt), hx = in_dtype(hx_in, cdt), cx = in_dtype(cx_in, cdt);

  const int64_t T = s.seq, N = s.batch, H = s.hidden, LD = s.layers * s.dirs;
  if (T == 0 || N == 0) {  // nothing to run: the states pass through
    const Shape y_shape = o.batch_first ? Shape{N, T, s.dirs * H} : Shape{T, N, s.dirs * H};
    Tensor hy = hx.defined() ? hx : Tensor::zeros({LD, N, H}, cdt, x.device());
    Tensor cy = lstm ? (cx.defined() ? cx : Tensor::zeros({LD, N, H}, cdt, x.device())) : Tensor();
    return {Tensor::zeros(y_shape, cdt, x.device()), hy, cy};
  }

  const int math = cdt != DType::f32 ? 2 : prec == Precision::tf32 ? 1 : 0;
  backend::RnnGeom probe;
  probe.mode = o.mode;
  probe.input = s.input;
  probe.hidden = H;
  probe.layers = drop ? 1 : s.layers;
  probe.seq = T;
  probe.batch = N;
  probe.bidirectional = o.bidirectional;
  probe.bias = o.bias;
  probe.batch_first = o.batch_first;
  probe.dtype = cdt;
  probe.math = math;
  const bool use_fused = o.allow_fused && be(x).rnn_supported(probe) &&
                         (!drop || be(x).rnn_supported([&] {
                           backend::RnnGeom upper = probe;
                           upper.input = s.dirs * H;
                           return upper;
                         }()));

  if (!use_fused) {
    Tensor xt = o.batch_first ? permute(x, {1, 0, 2}) : dense(x);
    RnnResult r = composed(xt, dense(w), dense(hx), dense(cx), o, s, gen);
    if (o.batch_first) r.y = permute(r.y, {1, 0, 2});
    return r;
  }
  if (!drop) return fused(x, w, hx, cx, o, s, math);

  // Layer by layer, with tandem's dropout between them.
  Tensor in = x, wd = dense(w), hxd = dense(hx), cxd = dense(cx);
  std::vector<Tensor> hy_parts, cy_parts;
  int64_t off = 0;
  for (int64_t l = 0; l < s.layers; ++l) {
    Dims ls = s;
    ls.layers = 1;
    ls.input = l == 0 ? s.input : s.dirs * H;
    const int64_t size = rnn_weight_size(o.mode, ls.input, H, 1, o.bidirectional, o.bias);
    Tensor wl = piece(wd, off, size, {size});
    off += size;
    Tensor hl = hxd.defined() ? piece(hxd, l * s.dirs, s.dirs, {s.dirs, N, H}) : Tensor();
    Tensor cl = cxd.defined() ? piece(cxd, l * s.dirs, s.dirs, {s.dirs, N, H}) : Tensor();
    RnnResult r = fused(in, wl, hl, cl, o, ls, math);
    in = l + 1 < s.layers ? dropout(r.y, o.dropout, true, *gen) : r.y;
    hy_parts.push_back(r.hy);
    if (lstm) cy_parts.push_back(r.cy);
  }
  return {in, concat(hy_parts, 0), lstm ? concat(cy_parts, 0) : Tensor()};
}

}  // namespace tandem
