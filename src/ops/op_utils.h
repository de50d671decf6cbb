#pragma once
// Internal helpers shared by the op families.
#include <initializer_list>

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
inline bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

// Raw (unrecorded) kernels used by the ops and their backward functions. Operands are read in place
// (any strides, broadcast without copies); outputs are dense, channels-last when an operand of the
// output's shape is.
/// An uninitialised elementwise output of shape: channels-last when an operand of that shape is
/// strictly channels-last, else contiguous.
Tensor ew_output(const Shape& shape, DType dtype, Device device, std::initializer_list<const Tensor*> operands);
/// op(a, b) of the given shape (the operands' broadcast shape).
Tensor binary_raw(backend::Binary op, const Tensor& a, const Tensor& b, const Shape& shape);
/// op(a, b), broadcast; operands whose shapes do not broadcast but hold as many elements are taken
/// flat, in a's shape (two gradients of one tensor).
Tensor binary_raw(backend::Binary op, const Tensor& a, const Tensor& b);
/// op(a, b, c) of the given shape (the operands' broadcast shape), in b's dtype.
Tensor ternary_raw(backend::Ternary op, const Tensor& a, const Tensor& b, const Tensor& c, const Shape& shape);
Tensor unary_raw(backend::Unary op, const Tensor& a, const backend::EwArgs& args = {});
/// The gradient of unary op from the incoming g (converted to saved's dtype) and saved, the op's output
/// or input (backend::grad_from_output).
Tensor unary_grad_raw(backend::Unary op, const Tensor& g, const Tensor& saved, const backend::EwArgs& args = {});
Tensor affine_raw(const Tensor& a, double alpha, double beta);
/// [out] contiguous gemm: op(a) op(b), row-major.
Tensor gemm_raw(bool ta, bool tb, const Tensor& a, const Tensor& b, Tensor out = Tensor());
/// In a backward function: the buffer for input i's gradient, the engine's destination when it matches
/// (see grad_destination), else a new one.
Tensor grad_buffer(size_t i, const Shape& shape, DType dtype, Device device);
/// In a backward function: db = the column sums of g viewed as [n, c] (the bias gradient of the layer whose
/// output gradient g is): the sums the kernel that wrote g took on its pass (see column_sums_of) where it did,
/// else a reduction over g.
void bias_grad_of(const Tensor& g, int64_t n, int64_t c, Tensor& db);
/// A tensor of the given shape filled with the value of the one-element tensor s (no host sync).
Tensor broadcast_scalar(const Tensor& s, const Shape& shape);

// Broadcasting (NumPy's rules: shapes aligned at the right, an extent of 1 or a missing one stretches).
/// The shape a and b broadcast to; throws, naming op and both operands, when they do not.
Shape broadcast_shape(const Tensor& a, const Tensor& b, const char* op);
/// A dense copy of x stretched to shape (x's shape must broadcast to it); x itself when already of it.
Tensor expand_raw(const Tensor& x, const Shape& shape);
/// The sum of g over the dimensions that broadcasting stretched to make g's shape from `shape`, as a
/// tensor of `shape`: the gradient of an operand that was broadcast.
Tensor sum_to_raw(const Tensor& g, const Shape& shape);

/// Throws unless perm orders the dimensions 0 .. dim-1 (each once); returns it with negative entries
/// counted from the end.
std::vector<int64_t> check_permutation(const std::vector<int64_t>& perm, int64_t dim, const char* op);
/// A contiguous copy of x with dimension i taken from dimension perm[i] of x (x itself, contiguous,
/// for the identity).
Tensor permute_raw(const Tensor& x, const std::vector<int64_t>& perm);
/// The permutation that undoes perm.
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm);
/// xs joined along dim (shapes checked by the caller), unrecorded.
Tensor concat_raw(const std::vector<Tensor>& xs, int64_t dim);

}  // namespace tandem::ops
