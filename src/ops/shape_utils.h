#pragma once
// Internal: helpers shared by the reduction, shape, indexing and product ops.
#include <vector>

#include "backend/backend.h"
#include "tandem/tensor.h"

namespace tandem::ops {

/// The dimensions a reduction runs over, checked.
struct ReducePlan {
  std::vector<bool> reduced;  // per dimension of x
  Shape kept;                 // x's shape with the reduced extents 1
  Shape out;                  // the result's shape (kept, or without the reduced dimensions)
  int64_t count = 1;          // elements reduced into each output
};

/// Normalises and checks dims (negative: from the end; each once) for a reduction named op.
ReducePlan plan_reduce(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op);
/// The reduction op over the dimensions marked in reduced, unrecorded, as a contiguous tensor of x's shape
/// with those extents 1 (arg as Backend::reduce's).
Tensor reduce_raw(backend::Backend::ReduceOp op, const Tensor& x, const std::vector<bool>& reduced, double arg);

/// dim in [0, rank) (negative: + rank), or an error naming op, dim and x.
int64_t normalize_dim(int64_t dim, int64_t rank, const Tensor& x, const char* op);
/// Strides that view x's elements (in row-major order) with `shape` without a copy, when x's strides allow
/// it; false otherwise.
bool view_strides(const Tensor& x, const Shape& shape, Shape& strides);
/// [outer, n, inner] extents of x around dimension dim.
void split_extents(const Shape& shape, int64_t dim, int64_t& outer, int64_t& n, int64_t& inner);

}  // namespace tandem::ops
