#pragma once
// Internal: the figures a language model's training reports per step — the device's peak rate for
// MFU and the step line printed by `tandem train` (llm.c's layout).
#include <cstdint>
#include <string>

#include "tandem/precision.h"

namespace tandem::cli {

/// The dense tensor-core peak of a GPU in FLOP/s for a precision, by the product name its driver
/// reports (device_name): H200 and H100 SXM 989e12 in bf16 and f16 (half that in tf32), H100 PCIe
/// 756e12, H100 NVL 835e12, A100 312e12. 0 when the device, or the precision (f32), is not in the table.
double peak_flops(const std::string& device_name, Precision precision);

/// Model FLOPs utilisation: the share of the peak that tokens_per_s tokens a second of flops_per_token
/// FLOPs each keep busy, on one device. 0 when either figure is unknown (0).
double mfu(double tokens_per_s, double flops_per_token, double peak);

/// One training step's figures, as the step line shows them.
struct LmStepFigures {
  int64_t step = 0, steps = 0;  // the step just taken (from 1) of the run's
  double loss = 0;              // the step's mean loss over every rank's tokens
  double lr = 0;
  double grad_norm = -1;    // before clipping; < 0: not computed (no --clip-norm)
  double step_ms = 0;       // wall time per step since the last line
  double tokens_per_s = 0;  // every rank's tokens
  double mfu = 0;           // 0: unknown (no line part)
};

/// "step 12/5000 | loss 2.345 | lr 1.0e-03 | norm 0.91 | 45.2 ms | 363,000 tok/s | MFU 38.1%"; the norm
/// and MFU parts only when known.
std::string lm_step_line(const LmStepFigures& f);

/// n with thousands separators: 363000 -> "363,000".
std::string with_commas(int64_t n);

}  // namespace tandem::cli
