#pragma once
// Column sums of a gradient, handed from the kernel that wrote the gradient to the op that needs them
// (layer norm's backward writes a residual stream's gradient; the bias of the layer that added into the
// stream needs its column sums), so that the second op does not read the gradient again to take them.
#include "tandem/tensor.h"

namespace tandem {

/// In a backward function: records that sums (f32, [cols]) are the column sums of t's elements viewed as
/// [t.numel() / cols, cols] (t contiguous), as they are now. Ignored outside a backward pass.
void set_column_sums(const Tensor& t, int64_t cols, const Tensor& sums);

/// In a backward function: the sums recorded for exactly t's elements with `cols` columns in this backward
/// pass, if the region has not been offered to an op to add into or taken by a leaf since; else undefined.
Tensor column_sums_of(const Tensor& t, int64_t cols);

/// Forgets the sums recorded for t's storage (its contents are about to change).
void drop_column_sums(const Tensor& t);

}  // namespace tandem
