// FP8 formats' names and limits, the scaling recipe, and the scale state kept on the device.
#include "core/fp8.h"

#include <cctype>
#include <cmath>
#include <string>

#include "backend/backend.h"
#include "tandem/error.h"
#include "tandem/fp8.h"

namespace tandem {

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

Fp8Format parse_fp8_format(std::string_view s) {
  std::string n;
  for (char c : s) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "e4m3") return Fp8Format::e4m3;
  if (n == "e5m2") return Fp8Format::e5m2;
  TANDEM_CHECK(false, "unknown FP8 format '", std::string(s), "' (choose e4m3 or e5m2)");
}

float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? fp8::kMaxE4m3 : fp8::kMaxE5m2; }

Fp8Recipe Fp8Recipe::current(int margin) {
  Fp8Recipe r;
  r.scaling = Fp8Scaling::current;
  r.margin = margin;
  return r;
}

Fp8Recipe Fp8Recipe::delayed(int64_t history, Fp8AmaxCompute compute, int margin) {
  Fp8Recipe r;
  r.scaling = Fp8Scaling::delayed;
  r.amax_history_len = history;
  r.amax_compute = compute;
  r.margin = margin;
  return r;
}

void Fp8Recipe::validate() const {
  TANDEM_CHECK(margin >= 0 && margin <= 64, "Fp8Recipe: margin ", margin, " is outside [0, 64]");
  TANDEM_CHECK(scaling == Fp8Scaling::current || amax_history_len >= 1, "Fp8Recipe: amax_history_len ",
               amax_history_len, " (delayed scaling keeps at least one step)");
}

Fp8ScaleState::Fp8ScaleState(const Fp8Recipe& recipe, Fp8Format format, int64_t count, Device device)
    : recipe_(recipe), format_(format), count_(count) {
  recipe.validate();
  TANDEM_CHECK(count >= 1, "Fp8ScaleState: ", count, " tensors (at least one)");
  scale_ = Tensor::ones({count}, DType::f32, device);
  scale_inv_ = Tensor::ones({count}, DType::f32, device);
  history_ = Tensor::zeros({recipe.history_rows(), count}, DType::f32, device);
}

namespace {
void check_slot(const Fp8ScaleState& s, int64_t i) {
  TANDEM_CHECK(s.defined() && i >= 0 && i < s.count(), "Fp8ScaleState: slot ", i, " of ", s.count());
}
}  // namespace

Tensor Fp8ScaleState::scale(int64_t i) const {
  check_slot(*this, i);
  return scale_.narrow(0, i, 1);
}

Tensor Fp8ScaleState::scale_inv(int64_t i) const {
  check_slot(*this, i);
  return scale_inv_.narrow(0, i, 1);
}

Tensor Fp8ScaleState::amax(int64_t i) const {
  check_slot(*this, i);
  return history_.view({-1}).narrow(0, i, 1);  // row 0 holds the first `count` elements
}

void Fp8ScaleState::update(const Tensor& verdict) const {
  TANDEM_CHECK(defined(), "Fp8ScaleState::update on a state that was never made");
  if (verdict.defined())
    TANDEM_CHECK(verdict.dtype() == DType::f32 && verdict.numel() == 1 && verdict.device() == device(),
                 "Fp8ScaleState::update: the verdict is one f32 value on ", device().str(), ", got ", verdict.str());
  Tensor h = history_, s = scale_, si = scale_inv_, v = verdict;
  backend::backend_for(device()).fp8_scale_update(h, s, si, fp8_max(format_),
                                                  std::ldexp(1.0f, recipe_.margin),
                                                  recipe_.amax_compute == Fp8AmaxCompute::max, v);
}

}  // namespace tandem
