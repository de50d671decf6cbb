#pragma once
// Dynamic loss scaling for f16 mixed precision. f16 gradients underflow below about 6e-8 and overflow
// above 65504: the loss is multiplied by a scale before backward, which lifts small gradients into
// range, and the averaged gradients are divided by it again before the update. A step whose averaged
// gradients hold an inf or NaN is skipped on every rank (they all see the same averages) and the scale
// halved; after a run of clean steps it doubles. bf16 has f32's range and needs none of this.
#include <cstdint>

#include "tandem/distributed/dist_opt.h"

namespace tandem::dist {

struct LossScalerOptions {
  double init_scale = 65536.0;     // 2^16
  double growth_factor = 2.0;      // after growth_interval clean steps in a row
  double backoff_factor = 0.5;     // after a step with inf/NaN gradients
  int64_t growth_interval = 2000;  // clean steps before the scale grows
};

/// Scales the losses of one DistOpt's steps. The DistOpt must check its averages for inf/NaN
/// (DistOptOptions::skip_nonfinite). A step: scale_loss, backward_and_sync, unscale, (clipping), update.
class LossScaler {
 public:
  LossScaler(DistOpt& opt, LossScalerOptions options = {});
  /// loss * scale(), recorded for backward (every gradient comes out multiplied by the scale).
  Tensor scale_loss(const Tensor& loss) const;
  /// Divides every averaged gradient by the scale (on the device). Once per step, after the step's
  /// last backward_and_sync and before clipping or update.
  void unscale();
  /// DistOpt::update(), then the scale's adjustment. Returns whether the step was applied (false on
  /// every rank alike when the gradients were not finite).
  bool update();
  double scale() const { return scale_; }
  /// Steps skipped for inf/NaN gradients so far.
  int64_t skipped_steps() const { return skipped_; }

 private:
  void set_scale(double s);
  DistOpt& opt_;
  LossScalerOptions options_;
  double scale_ = 0.0;
  int64_t clean_ = 0, skipped_ = 0;
  Tensor scale_t_, inverse_t_;  // the scale and its inverse, on the device
};

}  // namespace tandem::dist
