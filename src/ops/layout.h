#pragma once
// Internal: storage order of 4-D activations. Every tensor keeps its logical NCHW shape; on CUDA, under
// a reduced precision, convolutions, batch normalisation, pooling and the elementwise ops between them
// keep activations stored n, h, w, c (channels last), which lets cuDNN use tensor-core kernels. Any
// other op sees such a tensor as non-contiguous and works on a contiguous copy, so results are the same
// whatever the storage order.
#include "tandem/precision.h"
#include "tandem/tensor.h"

namespace tandem::ops {

/// True when t is 4-D and stored n, h, w, c. Also true where that coincides with contiguous storage
/// (one channel, or 1x1 planes).
bool is_channels_last(const Tensor& t);
/// True when t is channels-last and not also contiguous: ops must then mind its order.
inline bool strictly_channels_last(const Tensor& t) { return is_channels_last(t) && !t.is_contiguous(); }
/// True when every element of t's storage range is used once (contiguous or channels-last).
inline bool is_dense(const Tensor& t) { return t.is_contiguous() || is_channels_last(t); }
/// An uninitialised [n, c, h, w] tensor stored n, h, w, c.
Tensor empty_channels_last(const Shape& shape, DType dtype, Device device);
/// An uninitialised tensor with t's shape, dtype and device, stored in t's order when t is dense.
Tensor empty_dense_like(const Tensor& t, DType dtype);
inline Tensor empty_dense_like(const Tensor& t) { return empty_dense_like(t, t.dtype()); }
/// t as dtype, stored channels-last or contiguous: t itself when it already is, else one converting copy.
Tensor to_dense(const Tensor& t, DType dtype, bool channels_last);
/// t in the storage order of `like` (contiguous unless `like` is strictly channels-last), same dtype.
inline Tensor like_layout(const Tensor& t, const Tensor& like) {
  return to_dense(t, t.dtype(), strictly_channels_last(like));
}

/// The element type convolutions and matrix products compute in on the device at precision p: the 16-bit
/// type of a mixed precision on CUDA, else `fallback` (the inputs' own type).
DType compute_dtype(Device d, Precision p, DType fallback);
/// Whether a convolution to k output channels on CUDA device d at precision p keeps its data
/// channels-last: under tf32, bf16 and f16 when k suits tensor cores (a multiple of 8); exact f32 stays
/// NCHW. TANDEM_CHANNELS_LAST=1 / 0 in the environment, or force_channels_last, overrides the choice for
/// every CUDA convolution, exact f32 included.
bool conv_channels_last(Device d, Precision p, int64_t k);
/// -1: choose per convolution (the default, or TANDEM_CHANNELS_LAST's value when set); 0 / 1: force.
void force_channels_last(int mode);

}  // namespace tandem::ops
