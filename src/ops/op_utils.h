#pragma once
// Internal helpers shared by the op families.
#include "backend/backend.h"
#include "tandem/autograd.h"
#include "tandem/tensor.h"

namespace tandem::ops {

inline backend::Backend& be(const Tensor& t) { return backend::backend_for(t.device()); }

/// Throws unless t is defined.
void check_defined(const Tensor& t, const char* op, const char* what);
/// Throws unless t is a floating tensor.
void check_floating(const Tensor& t, const char* op, const char* what);
/// Throws unless a and b agree in shape, dtype and device.
void check_same(const Tensor& a, const Tensor& b, const char* op);
/// Throws unless t has the given number of dimensions.
void check_dim(const Tensor& t, int64_t dim, const char* op, const char* what);
/// Throws unless a and b are on the same device.
void check_same_device(const Tensor& a, const Tensor& b, const char* op);

/// A new tensor with a's shape, dtype and device.
inline Tensor empty_like(const Tensor& a) { return Tensor::empty(a.shape(), a.dtype(), a.device()); }

// Raw (unrecorded) kernels used by the ops and their backward functions.
Tensor binary_raw(backend::Binary op, const Tensor& a, const Tensor& b);
Tensor unary_raw(backend::Unary op, const Tensor& a);
Tensor affine_raw(const Tensor& a, double alpha, double beta);
/// [out] contiguous gemm: op(a) op(b), row-major.
Tensor gemm_raw(bool ta, bool tb, const Tensor& a, const Tensor& b, Tensor out = Tensor());
/// In a backward function: the buffer for input i's gradient, the engine's destination when it matches
/// (see grad_destination), else a new one.
Tensor grad_buffer(size_t i, const Shape& shape, DType dtype, Device device);
/// A tensor of the given shape filled with the value of the one-element tensor s (no host sync).
Tensor broadcast_scalar(const Tensor& s, const Shape& shape);

}  // namespace tandem::ops
