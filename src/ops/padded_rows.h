#pragma once
// Rows padded with a column of ones. A layer norm that feeds a layer with a bias can write its [n, c] output
// as the first c columns of [n, ld] rows whose column c holds ones (and the rest of the row zeros). The
// layer's forward product reads the c columns (a row stride of ld); its weight-gradient product reads the
// whole rows, g^T [x 1 0] = [g^T x, g's column sums, 0]: the bias gradient comes out of the product that
// reads g for the weight's, in place of a pass of its own over g.
#include <cstdint>

#include "tandem/tensor.h"

namespace tandem::ops {

/// Whether transformer blocks on device d have their layer norms write padded rows for the products after
/// them: TANDEM_BIAS_FROM_PRODUCT=1 on, 0 off; unset, on for CUDA devices and off on the CPU.
bool bias_from_product(Device d);
/// Sets it for this process (tests): 1 on, 0 off, -1 back to the environment's choice.
void set_bias_from_product(int mode);

/// The row stride of padded rows of c columns: c + 1 rounded up to a multiple of 8 elements (16 bytes of
/// 16-bit data, so that rows stay aligned for vector access).
int64_t padded_ld(int64_t c);

/// Records that buf ([rows, ld], contiguous, from its storage's first element) holds padded rows of cols
/// columns (column cols all ones, the rest of each row after it zero).
void mark_padded_rows(const Tensor& buf, int64_t cols);

/// For x [n, c]: the [n, ld] view (contiguous, no autograd history) of the padded rows x is the first c
/// columns of, where x is such a view of a storage marked by mark_padded_rows; else undefined.
Tensor padded_rows_of(const Tensor& x);

/// layer_norm with its output's rows padded (one normalized dimension; else as layer_norm): the same values
/// and gradients, x's shape, a row stride of padded_ld(c).
Tensor layer_norm_padded(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                         double eps);

}  // namespace tandem::ops
