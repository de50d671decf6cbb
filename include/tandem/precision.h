#pragma once
// Numeric precision of training: the math convolutions and matrix products may use on a GPU.
#include <cstdint>
#include <string_view>

#include "tandem/device.h"
#include "tandem/dtype.h"

namespace tandem {

/// How convolutions and matrix products compute on CUDA devices (the CPU always computes exact f32):
///  f32   exact f32, agrees with the CPU
///  tf32  f32 tensors; cuDNN and cuBLAS may use TF32 tensor cores (10-bit mantissa products, f32 sums)
///  bf16, f16  mixed precision: f32 master weights and optimizer state; convolutions and matrix products
///        in 16-bit with f32 accumulation; softmax, loss, batch-norm statistics and reductions in f32.
///        f16 needs loss scaling (see optim::LossScaler); bf16 does not.
enum class Precision : uint8_t { f32, tf32, bf16, f16 };

/// Parses "f32", "tf32", "bf16", "f16" (also "fp32", "float32", "bfloat16", "fp16", "float16", "half");
/// throws tandem::Error listing the choices otherwise.
Precision parse_precision(std::string_view s);
/// "f32", "tf32", "bf16" or "f16".
const char* precision_name(Precision p);
/// The default for training on a device: tf32 on CUDA (cuDNN's default in PyTorch too), f32 on the CPU.
Precision default_precision(Device d);
/// The activation type of a precision: bf16 or f16 for the mixed ones, f32 otherwise.
DType activation_dtype(Precision p);

/// While alive, ops on this thread that run on a CUDA device compute at precision p; 4-D activations
/// are then kept channels-last (NHWC) where that lets cuDNN use tensor cores. Tensors keep their NCHW
/// shape whatever their memory layout. Backward passes run at the precision of their forward op.
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision prev_;
};

/// The precision of the innermost PrecisionScope on this thread (f32 outside any).
Precision current_precision();

/// When on, GPU kernels are chosen among those that give the same bits on every run (cuDNN offers
/// faster ones that add in a varying order); off by default. Affects convolutions chosen afterwards.
void set_deterministic_algorithms(bool on);
bool deterministic_algorithms();

}  // namespace tandem
