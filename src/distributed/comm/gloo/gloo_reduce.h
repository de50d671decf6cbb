#pragma once
// Internal: element-wise reductions for Gloo's all-reduce, and the scaling that turns a sum into an
// average, for every dtype the Gloo communicator reduces.
#include <cstddef>
#include <functional>

#include "tandem/dtype.h"

namespace tandem::dist::gloo_detail {

/// Gloo's reduction signature: c[i] = a[i] op b[i] for n elements (c may alias a or b).
using ReduceFn = void (*)(void* c, const void* a, const void* b, size_t n);

/// The summing function for a dtype; throws tandem::Error (Input), naming the collective `what`, for
/// dtypes the reductions do not take.
ReduceFn sum_function(DType t, const char* what = "all_reduce");
/// x[i] /= divisor for n elements: rounded once for floating types, truncated toward zero for integers.
void divide_in_place(void* x, size_t n, DType t, int divisor);

}  // namespace tandem::dist::gloo_detail
