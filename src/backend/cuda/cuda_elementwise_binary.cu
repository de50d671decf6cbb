// CUDA: the two-operand elementwise ops (arithmetic, comparisons, logical ops, pow, prelu) and axpy in
// the generic kernel.
#include "backend/cuda/cuda_elementwise.cuh"

namespace tandem::backend::ewcuda {

void binary(Binary op, const Launch& l) {
  dispatch_types(l.dtype, takes_integers(op), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    ewf::with_binary<Compute<T>>(op, [&](auto f) { run<T, 2>(f, l); });
  });
}

void axpy(double alpha, const Launch& l) {
  kern::dispatch_float(l.dtype, "axpy", [&](auto tag) {
    using T = decltype(tag);
    run<T, 2>(ewf::AxpyF<float>{static_cast<float>(alpha)}, l);
  });
}

}  // namespace tandem::backend::ewcuda
