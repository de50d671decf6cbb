#pragma once
// SINGA's sparsified all-reduce as a collective of its own, outside DistOpt: for code that sums a
// tensor over the ranks sending only part of it (DistOpt's sparse methods do this per bucket).
#include "tandem/distributed/communicator.h"

namespace tandem::dist {

/// In place and blocking: t = the sum over the ranks of each rank's selection from x = t (+ residual):
/// with top_k the ceil(spars * n) values of largest magnitude, otherwise those with |x| >= spars;
/// what is not selected is 0. With a residual (defined: f32, as many elements as t, on t's device),
/// the selection is made from t + residual and residual becomes what was not selected (error
/// feedback). t is f32 on the communicator's device. Every rank must call it with the same sizes.
void sparse_all_reduce(Communicator& comm, Tensor& t, Tensor residual, double spars, bool top_k);

}  // namespace tandem::dist
