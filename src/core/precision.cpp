#include "tandem/precision.h"

#include <atomic>
#include <cctype>
#include <string>

#include "tandem/error.h"

namespace tandem {

namespace {
thread_local Precision t_precision = Precision::f32;
std::atomic<bool> g_deterministic{false};
}  // namespace

Precision parse_precision(std::string_view s) {
  std::string n;
  for (char c : s) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return Precision::f32;
  if (n == "tf32") return Precision::tf32;
  if (n == "bf16" || n == "bfloat16") return Precision::bf16;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return Precision::f16;
  TANDEM_CHECK(false, "unknown precision '", std::string(s), "' (choose f32, tf32, bf16 or f16)");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::f32: return "f32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    case Precision::f16: return "f16";
  }
  return "?";
}

Precision default_precision(Device d) { return d.is_cuda() ? Precision::tf32 : Precision::f32; }

DType activation_dtype(Precision p) {
  switch (p) {
    case Precision::bf16: return DType::bf16;
    case Precision::f16: return DType::f16;
    default: return DType::f32;
  }
}

PrecisionScope::PrecisionScope(Precision p) : prev_(t_precision) { t_precision = p; }
PrecisionScope::~PrecisionScope() { t_precision = prev_; }

Precision current_precision() { return t_precision; }

void set_deterministic_algorithms(bool on) { g_deterministic.store(on); }
bool deterministic_algorithms() { return g_deterministic.load(); }

}  // namespace tandem
