// Convolution and pooling: NCHW semantics whatever the storage order (see ops/layout.h).
#include <string>

#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& opt) {
  check_dim(x, 4, "conv2d", "input");
  check_dim(w, 4, "conv2d", "weight");
  check_floating(x, "conv2d", "input");
  check_floating(w, "conv2d", "weight");
  check_same_device(x, w, "conv2d");
  const Precision prec = current_precision();
  const bool mixed = compute_dtype(x.device(), prec, DType::f64) != DType::f64;  // 16-bit copies are made here
  TANDEM_CHECK(x.dtype() == w.dtype() || mixed, "conv2d: input ", x.str(), " and weight ", w.str(),
               " differ in dtype");
  const int64_t groups = opt.groups;
  TANDEM_CHECK(groups >= 1, "conv2d: groups must be at least 1, got ", groups);
  if (groups == 1) {
    TANDEM_CHECK(x.size(1) == w.size(1), "conv2d: input ", x.str(), " has ", x.size(1), " channels, the weight ",
                 w.str(), " expects ", w.size(1));
  } else {
    TANDEM_CHECK(x.size(1) % groups == 0 && w.size(0) % groups == 0, "conv2d: ", groups,
                 " groups must divide the input channels (", x.size(1), ") and the filters (", w.size(0), ")");
    TANDEM_CHECK(x.size(1) == w.size(1) * groups, "conv2d: input ", x.str(), " has ", x.size(1),
                 " channels, the weight ", w.str(), " expects ", w.size(1), " per group, ", w.size(1) * groups, " in ",
                 groups, " groups");
  }
  TANDEM_CHECK(opt.stride[0] >= 1 && opt.stride[1] >= 1, "conv2d: stride must be at least 1");
  TANDEM_CHECK(opt.padding[0] >= 0 && opt.padding[1] >= 0, "conv2d: padding must not be negative");
  if (b.defined()) {
    check_dim(b, 1, "conv2d", "bias");
    TANDEM_CHECK(b.size(0) == w.size(0) && b.dtype() == w.dtype(), "conv2d: bias ", b.str(),
                 " does not match weight ", w.str());
    check_same_device(x, b, "conv2d");
  }
  backend::ConvGeom g{x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2), w.size(3),
                      opt.stride[0], opt.stride[1], opt.padding[0], opt.padding[1], 0, 0};
  int64_t eh = g.h + 2 * g.pad_h - g.r, ew = g.w + 2 * g.pad_w - g.s;
  TANDEM_CHECK(eh >= 0 && ew >= 0, "conv2d: kernel ", g.r, "x", g.s, " larger than the padded input ", x.str());
  g.oh = eh / g.stride_h + 1;
  g.ow = ew / g.stride_w + 1;
  g.groups = groups;
  // Grouped convolutions stay NCHW: their channel slices are too narrow for the 16-bit tensor-core
  // kernels that channels-last exists for.
  g.nhwc = groups == 1 && conv_channels_last(x.device(), prec, g.k);
  // 16-bit only where tensor cores take it (channels-last, input channels in multiples of 8 too): cuDNN's
  // other 16-bit kernels are slower than TF32 ones, so such a convolution computes in f32 (TF32); a
  // 1-channel image's first layer takes its input as it comes, in f32.
  const DType cdt = !mixed ? x.dtype() : g.nhwc && g.c % 8 == 0 ? activation_dtype(prec) : DType::f32;
  // Under a mixed precision the 16-bit copies of input and weight are made here (with the change of
  // storage order, in one pass each); gradients go back in the types of x and w.
  Tensor xc = to_dense(x, cdt, g.nhwc), wc = to_dense(w, cdt, g.nhwc);
  Tensor y = g.nhwc ? empty_channels_last({g.n, g.k, g.oh, g.ow}, cdt, x.device())
                    : Tensor::empty({g.n, g.k, g.oh, g.ow}, cdt, x.device());
  if (y.numel()) be(x).conv2d_forward(xc, wc, b.defined() ? b.contiguous() : Tensor(), g, y, opt.relu);
  bool need_x = x.requires_grad(), need_w = w.requires_grad(), need_b = b.defined() && b.requires_grad();
  Tensor sx = need_w ? xc.detach() : Tensor(), sw = need_x ? wc.detach() : Tensor();
  Tensor sy = opt.relu ? y.detach() : Tensor();
  const DType x_dtype = x.dtype(), w_dtype = w.dtype();
  const Shape wshape = w.shape();
  return record_op(y, {x, w, b}, "conv2d",
                   [g, sx, sw, sy, need_b, need_w, wshape, prec, cdt, x_dtype, w_dtype](const Tensor& grad) {
    PrecisionScope scope(prec);
    Tensor dy = to_dense(grad, cdt, g.nhwc);
    Tensor dx, dw, db;
    if (need_b) db = grad_buffer(2, {g.k}, w_dtype, dy.device());
    if (sy.defined()) {  // the fused ReLU: mask the gradient first (and sum it for the bias on the way)
      Tensor masked = empty_dense_like(dy);
      const int64_t rows = g.nhwc ? g.n * g.oh * g.ow : g.n, plane = g.nhwc ? 1 : g.oh * g.ow;
      be(dy).relu_bias_grad(dy, sy, rows, g.k, plane, masked, db);
      dy = masked;
    }
    if (sw.defined()) {
      // Where another op's gradient for x has arrived already (a residual connection), this one is
      // added into it by the convolution itself.
      Tensor acc = grad_add_target(0);
      const bool into = acc.defined() && x_dtype == cdt && acc.dtype() == cdt &&
                        acc.shape() == Shape({g.n, g.c, g.h, g.w}) &&
                        (g.nhwc ? strictly_channels_last(acc) : acc.is_contiguous());
      dx = into ? acc
           : g.nhwc ? empty_channels_last({g.n, g.c, g.h, g.w}, cdt, dy.device())
                    : Tensor::empty({g.n, g.c, g.h, g.w}, cdt, dy.device());
      be(dy).conv2d_backward_data(dy, sw, g, dx, into);
      if (x_dtype != cdt) dx = to_dense(dx, x_dtype, g.nhwc);
    }
    if (need_w || (need_b && !sy.defined())) {
      Tensor no_bias;
      if (need_w)
        dw = g.nhwc             ? empty_channels_last(wshape, cdt, dy.device())
             : cdt == w_dtype ? grad_buffer(1, wshape, cdt, dy.device())
                              : Tensor::empty(wshape, cdt, dy.device());
      be(dy).conv2d_backward_weight(dy, sx, g, dw, sy.defined() ? no_bias : db);
      if (need_w) dw = to_dense(dw, w_dtype, false);
    }
    return std::vector<Tensor>{dx, dw, db};
  });
}

namespace {
backend::PoolGeom pool_geom(const Tensor& x, const Pool2dOptions& opt, const char* op) {
  check_dim(x, 4, op, "input");
  check_floating(x, op, "input");
  TANDEM_CHECK(opt.kernel[0] >= 1 && opt.kernel[1] >= 1, op, ": kernel must be at least 1x1");
  TANDEM_CHECK(opt.stride[0] >= 1 && opt.stride[1] >= 1, op, ": stride must be at least 1");
  const std::array<int, 2> end{opt.padding_end[0] < 0 ? opt.padding[0] : opt.padding_end[0],
                               opt.padding_end[1] < 0 ? opt.padding[1] : opt.padding_end[1]};
  // Windows then always hold an input element: max never returns a padded position, and the mean over
  // the input elements has a divisor.
  for (int i = 0; i < 2; ++i)
    TANDEM_CHECK(opt.padding[i] >= 0 && opt.padding[i] * 2 <= opt.kernel[i] && end[i] * 2 <= opt.kernel[i], op,
                 ": padding must be between 0 and half the kernel, got ", opt.padding[i],
                 end[i] != opt.padding[i] ? " before and " + std::to_string(end[i]) + " after" : std::string(),
                 " for a kernel of ", opt.kernel[i]);
  backend::PoolGeom g{x.size(0), x.size(1), x.size(2), x.size(3), opt.kernel[0], opt.kernel[1],
                      opt.stride[0], opt.stride[1], opt.padding[0], opt.padding[1], 0, 0};
  g.pad_bottom = end[0];
  g.pad_right = end[1];
  g.count_pad = opt.count_include_pad;
  const int64_t eh = g.h + g.pad_h + end[0] - g.kh, ew = g.w + g.pad_w + end[1] - g.kw;
  TANDEM_CHECK(eh >= 0 && ew >= 0, op, ": window ", g.kh, "x", g.kw, " larger than the padded input ", x.str());
  // ceil_mode: one more window where the division leaves a remainder, unless that window would start in
  // the trailing padding (or past it), where it would cover no input element.
  auto out = [&](int64_t extent, int64_t stride, int64_t in, int64_t pad) {
    int64_t o = (opt.ceil_mode ? (extent + stride - 1) / stride : extent / stride) + 1;
    if (opt.ceil_mode && (o - 1) * stride >= in + pad) --o;
    return o;
  };
  g.oh = out(eh, g.stride_h, g.h, g.pad_h);
  g.ow = out(ew, g.stride_w, g.w, g.pad_w);
  return g;
}
}  // namespace

namespace {
// A pooling output or input gradient of the given shape in the layout the geometry says.
Tensor pool_tensor(const backend::PoolGeom& g, const Shape& shape, DType dtype, Device d) {
  return g.nhwc ? empty_channels_last(shape, dtype, d) : Tensor::empty(shape, dtype, d);
}
}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& opt) {
  backend::PoolGeom g = pool_geom(x, opt, "max_pool2d");
  g.nhwc = x.device().is_cuda() && strictly_channels_last(x);  // pooling keeps a channels-last input so
  Tensor xc = g.nhwc ? x : x.contiguous();
  Tensor y = pool_tensor(g, {g.n, g.c, g.oh, g.ow}, x.dtype(), x.device());
  Tensor idx = pool_tensor(g, {g.n, g.c, g.oh, g.ow}, DType::i32, x.device());
  if (y.numel()) be(x).max_pool2d_forward(xc, g, y, idx);
  Tensor sx = xc.detach(), sy = y.detach();
  return record_op(y, {x}, "max_pool2d", [g, sx, sy, idx](const Tensor& grad) {
    Tensor dy = to_dense(grad, sy.dtype(), g.nhwc);
    Tensor dx = pool_tensor(g, {g.n, g.c, g.h, g.w}, dy.dtype(), dy.device());
    be(dy).max_pool2d_backward(dy, sx, sy, idx, g, dx);
    return std::vector<Tensor>{dx};
  });
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& opt) {
  backend::PoolGeom g = pool_geom(x, opt, "avg_pool2d");
  g.nhwc = x.device().is_cuda() && strictly_channels_last(x);
  Tensor y = pool_tensor(g, {g.n, g.c, g.oh, g.ow}, x.dtype(), x.device());
  if (y.numel()) be(x).avg_pool2d_forward(g.nhwc ? x : x.contiguous(), g, y);
  const DType dtype = x.dtype();
  return record_op(y, {x}, "avg_pool2d", [g, dtype](const Tensor& grad) {
    Tensor dy = to_dense(grad, dtype, g.nhwc);
    Tensor dx = pool_tensor(g, {g.n, g.c, g.h, g.w}, dy.dtype(), dy.device());
    be(dy).avg_pool2d_backward(dy, g, dx);
    return std::vector<Tensor>{dx};
  });
}

}  // namespace tandem
