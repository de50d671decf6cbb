// CUDA: the one-operand elementwise ops (math, rounding, activations) in the generic kernel.
#include "backend/cuda/cuda_elementwise.cuh"

namespace tandem::backend::ewcuda {

void unary(Unary op, const EwArgs& args, const Launch& l) {
  dispatch_types(l.dtype, false, op_name(op), [&](auto tag) {
    using T = decltype(tag);
    ewf::with_unary<float>(op, args, [&](auto f) { run<T, 1>(f, l); });
  });
}

}  // namespace tandem::backend::ewcuda
