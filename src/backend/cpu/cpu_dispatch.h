#pragma once
// Internal: calls a generic lambda with a value of the C++ type matching a DType.
#include "tandem/dtype.h"
#include "tandem/error.h"

namespace tandem::backend {

/// Every dtype.
template <typename F>
void dispatch_all(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::f16: return f(Half{});
    case DType::bf16: return f(BFloat16{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    case DType::u8: return f(uint8_t{});
  }
}

/// f32 and f64, the types the CPU compute kernels take.
template <typename F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    default: TANDEM_CHECK(false, op, ": dtype ", dtype_name(t), " is not supported on the CPU (use f32 or f64)");
  }
}

/// f32, f64, i32, i64: arithmetic types.
template <typename F>
void dispatch_arith(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    default: TANDEM_CHECK(false, op, ": dtype ", dtype_name(t), " is not supported on the CPU");
  }
}

}  // namespace tandem::backend
