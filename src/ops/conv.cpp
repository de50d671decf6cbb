// Convolution and pooling (NCHW).
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& opt) {
  check_dim(x, 4, "conv2d", "input");
  check_dim(w, 4, "conv2d", "weight");
  check_floating(x, "conv2d", "input");
  TANDEM_CHECK(x.dtype() == w.dtype(), "conv2d: input ", x.str(), " and weight ", w.str(), " differ in dtype");
  check_same_device(x, w, "conv2d");
  TANDEM_CHECK(x.size(1) == w.size(1), "conv2d: input ", x.str(), " has ", x.size(1), " channels, the weight ",
               w.str(), " expects ", w.size(1));
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
  Tensor xc = x.contiguous(), wc = w.contiguous();
  Tensor y = Tensor::empty({g.n, g.k, g.oh, g.ow}, x.dtype(), x.device());
  if (y.numel()) be(x).conv2d_forward(xc, wc, b.defined() ? b.contiguous() : Tensor(), g, y);
  bool need_x = x.requires_grad(), need_w = w.requires_grad(), need_b = b.defined() && b.requires_grad();
  Tensor sx = need_w ? xc.detach() : Tensor(), sw = need_x ? wc.detach() : Tensor();
  Shape wshape = w.shape();
  return record_op(y, {x, w, b}, "conv2d", [g, sx, sw, need_b, need_w, wshape](const Tensor& grad) {
    Tensor dy = grad.contiguous();
    Tensor dx, dw, db;
    if (sw.defined()) {
      dx = Tensor::empty({g.n, g.c, g.h, g.w}, dy.dtype(), dy.device());
      be(dy).conv2d_backward_data(dy, sw, g, dx);
    }
    if (need_w || need_b) {
      if (need_w) dw = Tensor::empty(wshape, dy.dtype(), dy.device());
      if (need_b) db = Tensor::empty({g.k}, dy.dtype(), dy.device());
      be(dy).conv2d_backward_weight(dy, sx, g, dw, db);
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
  TANDEM_CHECK(opt.padding[0] >= 0 && opt.padding[1] >= 0 && opt.padding[0] * 2 <= opt.kernel[0] &&
                   opt.padding[1] * 2 <= opt.kernel[1],
               op, ": padding must be between 0 and half the kernel");
  backend::PoolGeom g{x.size(0), x.size(1), x.size(2), x.size(3), opt.kernel[0], opt.kernel[1],
                      opt.stride[0], opt.stride[1], opt.padding[0], opt.padding[1], 0, 0};
  int64_t eh = g.h + 2 * g.pad_h - g.kh, ew = g.w + 2 * g.pad_w - g.kw;
  TANDEM_CHECK(eh >= 0 && ew >= 0, op, ": window ", g.kh, "x", g.kw, " larger than the padded input ", x.str());
  g.oh = eh / g.stride_h + 1;
  g.ow = ew / g.stride_w + 1;
  return g;
}
}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& opt) {
  backend::PoolGeom g = pool_geom(x, opt, "max_pool2d");
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty({g.n, g.c, g.oh, g.ow}, x.dtype(), x.device());
  Tensor idx = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::i32, x.device());
  if (y.numel()) be(x).max_pool2d_forward(xc, g, y, idx);
  Tensor sx = xc.detach(), sy = y.detach();
  return record_op(y, {x}, "max_pool2d", [g, sx, sy, idx](const Tensor& grad) {
    Tensor dy = grad.contiguous();
    Tensor dx = Tensor::empty({g.n, g.c, g.h, g.w}, dy.dtype(), dy.device());
    be(dy).max_pool2d_backward(dy, sx, sy, idx, g, dx);
    return std::vector<Tensor>{dx};
  });
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& opt) {
  backend::PoolGeom g = pool_geom(x, opt, "avg_pool2d");
  Tensor y = Tensor::empty({g.n, g.c, g.oh, g.ow}, x.dtype(), x.device());
  if (y.numel()) be(x).avg_pool2d_forward(x.contiguous(), g, y);
  return record_op(y, {x}, "avg_pool2d", [g](const Tensor& grad) {
    Tensor dy = grad.contiguous();
    Tensor dx = Tensor::empty({g.n, g.c, g.h, g.w}, dy.dtype(), dy.device());
    be(dy).avg_pool2d_backward(dy, g, dx);
    return std::vector<Tensor>{dx};
  });
}

}  // namespace tandem
