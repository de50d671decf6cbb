// CUDA: the gradients of the one-operand elementwise ops, and the three-operand ops (where and the
// gradients of two-operand ones), in the generic kernel.
#include "backend/cuda/cuda_elementwise.cuh"

namespace tandem::backend::ewcuda {

void unary_grad(Unary op, const EwArgs& args, const Launch& l) {
  dispatch_types(l.dtype, false, backward_name(op), [&](auto tag) {
    using T = decltype(tag);
    ewf::with_unary_grad<float>(op, args, [&](auto f) { run<T, 2>(f, l); });
  });
}

void ternary(Ternary op, const Launch& l) {
  dispatch_types(l.dtype, op == Ternary::Where, op_name(op), [&](auto tag) {
    using T = decltype(tag);
    ewf::with_ternary<Compute<T>>(op, [&](auto f) { run<T, 3>(f, l); });
  });
}

}  // namespace tandem::backend::ewcuda
