#include "ops/param_copies.h"

#include "core/tensor_impl.h"
#include "tandem/error.h"

namespace tandem {

namespace {
thread_local const ParamCopies* t_active = nullptr;
}  // namespace

ParamCopies::ParamCopies(const std::vector<Tensor>& params, std::vector<Tensor> copies, DType dtype)
    : dtype_(dtype), copies_(std::move(copies)) {
  TANDEM_CHECK(dtype == DType::bf16 || dtype == DType::f16, "parameter copies are bf16 or f16, not ", dtype_name(dtype));
  TANDEM_CHECK(copies_.size() == params.size(), "ParamCopies: ", copies_.size(), " copies for ", params.size(),
               " parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& c = copies_[i];
    if (!c.defined()) continue;
    TANDEM_CHECK(params[i].defined() && c.dtype() == dtype && c.shape() == params[i].shape() && c.is_contiguous(),
                 "ParamCopies: copy ", i, " ", c.str(), " is not a contiguous ", dtype_name(dtype), " tensor of ",
                 params[i].defined() ? params[i].str() : std::string("an undefined parameter"), "'s shape");
    index_.emplace(params[i].impl(), i);
  }
}

Tensor ParamCopies::find(const Tensor& t, DType dtype) const {
  if (dtype != dtype_ || !t.defined()) return Tensor();
  auto it = index_.find(t.impl());
  return it == index_.end() ? Tensor() : copies_[it->second];
}

ParamCopiesScope::ParamCopiesScope(const ParamCopies* copies) : prev_(t_active) { t_active = copies; }
ParamCopiesScope::~ParamCopiesScope() { t_active = prev_; }

Tensor active_param_copy(const Tensor& t, DType dtype) {
  return t_active ? t_active->find(t, dtype) : Tensor();
}

}  // namespace tandem
