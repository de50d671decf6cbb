// The figures of a language model's training steps.
#include "cli/lm_report.h"

#include <cmath>
#include <cstdio>

namespace tandem::cli {

double peak_flops(const std::string& name, Precision precision) {
  const DType act = activation_dtype(precision);
  const bool half = act == DType::bf16 || act == DType::f16;
  const bool tf32 = precision == Precision::tf32;
  if (!half && !tf32) return 0.0;
  auto has = [&name](const char* part) { return name.find(part) != std::string::npos; };
  // Dense 16-bit tensor-core rates from NVIDIA's data sheets; TF32's is half of it.
  double bf16 = 0.0;
  if (has("H200"))
    bf16 = 989e12;
  else if (has("H100") && has("PCIe"))
    bf16 = 756e12;
  else if (has("H100") && has("NVL"))
    bf16 = 835e12;
  else if (has("H100"))
    bf16 = 989e12;  // SXM (HBM3)
  else if (has("A100"))
    bf16 = 312e12;
  return tf32 ? bf16 / 2.0 : bf16;
}

double mfu(double tokens_per_s, double flops_per_token, double peak) {
  if (!(tokens_per_s > 0.0) || !(flops_per_token > 0.0) || !(peak > 0.0)) return 0.0;
  return tokens_per_s * flops_per_token / peak;
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string lm_step_line(const LmStepFigures& f) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.1e", static_cast<long long>(f.step),
                static_cast<long long>(f.steps), f.loss, f.lr);
  std::string line = buf;
  if (f.grad_norm >= 0.0) {
    std::snprintf(buf, sizeof buf, " | norm %.2f", f.grad_norm);
    line += buf;
  }
  std::snprintf(buf, sizeof buf, " | %.1f ms | ", f.step_ms);
  line += buf;
  line += with_commas(static_cast<int64_t>(std::llround(f.tokens_per_s))) + " tok/s";
  if (f.mfu > 0.0) {
    std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100.0 * f.mfu);
    line += buf;
  }
  return line;
}

}  // namespace tandem::cli
