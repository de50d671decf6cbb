#pragma once
// Internal: 16-bit copies of f32 parameters, kept equal to the parameters' rounding by what updates them
// (dist::DistOpt::keep_parameter_copies: AdamW's step, or the sharded step's gather), read by the 16-bit
// products in place of a conversion of every weight at every step.
#include <cstddef>
#include <unordered_map>
#include <vector>

#include "tandem/tensor.h"

namespace tandem {

struct TensorImpl;

class ParamCopies {
 public:
  /// The given copies (copies[i]: params[i]'s in `dtype`, bf16 or f16, or undefined), kept current by
  /// their owner (dist::DistOpt::keep_parameter_copies).
  ParamCopies(const std::vector<Tensor>& params, std::vector<Tensor> copies, DType dtype);
  /// The copy of t in `dtype` when t is one of the parameters itself (the same tensor, not a view of it),
  /// else an undefined tensor.
  Tensor find(const Tensor& t, DType dtype) const;

 private:
  DType dtype_;
  std::vector<Tensor> copies_;
  std::unordered_map<const TensorImpl*, size_t> index_;
};

/// While alive, ops on this thread read a parameter's copy from `copies` (null: none) wherever they would
/// convert that parameter to the copies' type (ops::to_dense). Whoever opens one answers for the copies
/// being current: nothing but the optimizer keeping them may write the parameters meanwhile.
class ParamCopiesScope {
 public:
  explicit ParamCopiesScope(const ParamCopies* copies);
  ~ParamCopiesScope();
  ParamCopiesScope(const ParamCopiesScope&) = delete;
  ParamCopiesScope& operator=(const ParamCopiesScope&) = delete;

 private:
  const ParamCopies* prev_;
};

/// The innermost ParamCopiesScope's copy of t in dtype, or an undefined tensor.
Tensor active_param_copy(const Tensor& t, DType dtype);

}  // namespace tandem
