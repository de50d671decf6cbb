// SwiGLU's gating, silu(gate) * up over a gated MLP's first product [..., 2H]: one backend kernel forward and one
// backward (which writes the gradient of the whole product), keeping only the product for the backward; the
// composition of split, silu and mul where the backend does not take the type.
#include "ops/layout.h"
#include "ops/op_utils.h"
#include "tandem/ops.h"

namespace tandem {

using namespace ops;

Tensor swiglu(const Tensor& x) {
  const char* op = "swiglu";
  check_defined(x, op, "input");
  check_floating(x, op, "input");
  TANDEM_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, op, ": input ", x.str(),
               " must be [..., 2H] (the gate, then the up projection), its last extent even");
  const int64_t hidden = x.size(-1) / 2;
  Shape shape = x.shape();
  shape.back() = hidden;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  auto composed = [&] {
    std::vector<Tensor> gate_up = split(x, {hidden, hidden}, x.dim() - 1);
    return mul(silu(gate_up[0]), gate_up[1]);
  };
  const Tensor xd = to_dense(x, x.dtype(), false).detach();
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  if (!be(x).swiglu_forward(xd, rows, hidden, y)) return composed();
  return record_op(y, {x}, op, [xd, rows, hidden](const Tensor& grad) {
    const Tensor g = to_dense(grad, xd.dtype(), false);
    Tensor dx = grad_buffer(0, xd.shape(), xd.dtype(), xd.device());
    TANDEM_CHECK(be(g).swiglu_backward(g, xd, rows, hidden, dx), "swiglu backward: the backend refused ", g.str(),
                 ", whose forward it took");
    return std::vector<Tensor>{dx};
  });
}

}  // namespace tandem
