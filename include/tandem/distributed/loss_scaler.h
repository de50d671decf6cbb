#pragma once
// Dynamic loss scaling for f16 mixed precision. f16 gradients underflow below about 6e-8 and overflow
// above 65504: the loss is multiplied by a scale before backward, which lifts small gradients into
// range, and every gradient is divided by it again as soon as backward produced it (before it is
// sent, so that what codecs carry between steps stays in unscaled units). A step whose averaged
// gradients hold an inf or NaN is skipped on every rank (they all see the same averages) and the scale
// halved; after a run of clean steps it doubles. The scale, its adjustment and the skip all live on the
// device: such steps can be recorded. bf16 has f32's range and needs none of this.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tandem/distributed/dist_opt.h"

namespace tandem::dist {

struct LossScalerOptions {
  double init_scale = 65536.0;     // 2^16
  double growth_factor = 2.0;      // after growth_interval clean steps in a row
  double backoff_factor = 0.5;     // after a step with inf/NaN gradients
  int64_t growth_interval = 2000;  // clean steps before the scale grows
};

/// Scales the losses of one DistOpt's steps. The DistOpt must check its averages for inf/NaN
/// (DistOptOptions::skip_nonfinite); the scaler makes it divide every gradient by the scale as it
/// arrives (DistOpt::set_gradient_scale). A step: scale_loss, backward_and_sync, (clipping), update.
class LossScaler {
 public:
  LossScaler(DistOpt& opt, LossScalerOptions options = {});
  ~LossScaler();
  LossScaler(const LossScaler&) = delete;
  LossScaler& operator=(const LossScaler&) = delete;
  /// loss * scale(), recorded for backward (every gradient comes out multiplied by the scale).
  Tensor scale_loss(const Tensor& loss) const;
  /// DistOpt::update(), then the scale's adjustment (on the device). Returns what DistOpt::update
  /// returns: whether the step was applied (false on every rank alike when the gradients were not finite).
  bool update();
  /// The current scale (read from the device: a wait).
  double scale() const;
  /// Steps skipped for inf/NaN gradients so far (read from the device: a wait).
  int64_t skipped_steps() const;
  /// The scale and its counters, for checkpoints ("scale": f32 [2], "counts": i64 [2]).
  std::vector<std::pair<std::string, Tensor>> state() const;
  /// Loads what state() returned; throws naming what does not fit.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& saved);

 private:
  DistOpt& opt_;
  LossScalerOptions options_;
  Tensor scale_;   // f32 [2] on the device: the scale and its inverse
  Tensor counts_;  // i64 [2] on the device: clean steps in a row, steps skipped
};

}  // namespace tandem::dist
