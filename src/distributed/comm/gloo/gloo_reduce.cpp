#include "distributed/comm/gloo/gloo_reduce.h"

#include <gloo/math.h>
#include <gloo/types.h>

#include "tandem/error.h"

namespace tandem::dist::gloo_detail {

namespace {

// bfloat16 has no Gloo type: add in float, round to nearest even once per element.
void sum_bf16(void* c_, const void* a_, const void* b_, size_t n) {
  auto* c = static_cast<BFloat16*>(c_);
  const auto* a = static_cast<const BFloat16*>(a_);
  const auto* b = static_cast<const BFloat16*>(b_);
  for (size_t i = 0; i < n; ++i) c[i] = BFloat16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

template <typename T>
void sum_plain(void* c_, const void* a_, const void* b_, size_t n) {
  auto* c = static_cast<T*>(c_);
  const auto* a = static_cast<const T*>(a_);
  const auto* b = static_cast<const T*>(b_);
  for (size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

template <typename T, typename Load, typename Store>
void divide_16(void* x_, size_t n, int d, Load load, Store store) {
  auto* x = static_cast<T*>(x_);
  const float df = static_cast<float>(d);
  for (size_t i = 0; i < n; ++i) x[i] = store(load(x[i]) / df);
}

template <typename T>
void divide_plain(void* x_, size_t n, int d) {
  auto* x = static_cast<T*>(x_);
  const T dt = static_cast<T>(d);
  for (size_t i = 0; i < n; ++i) x[i] /= dt;
}

}  // namespace

ReduceFn sum_function(DType t, const char* what) {
  switch (t) {
    case DType::f32: return &sum_plain<float>;
    case DType::f64: return &sum_plain<double>;
    case DType::f16: {
      // Gloo's half type adds through float and rounds to nearest even, as the GPUs do.
      void (*f)(void*, const void*, const void*, size_t) = &gloo::sum<gloo::float16>;
      return f;
    }
    case DType::bf16: return &sum_bf16;
    case DType::i32: return &sum_plain<int32_t>;
    case DType::i64: return &sum_plain<int64_t>;
    default:
      TANDEM_CHECK(false, what, ": dtype ", dtype_name(t),
                   " cannot be reduced by the gloo communicator (use f32, f64, f16, bf16, i32 or i64)");
  }
}

void divide_in_place(void* x, size_t n, DType t, int d) {
  switch (t) {
    case DType::f32: return divide_plain<float>(x, n, d);
    case DType::f64: return divide_plain<double>(x, n, d);
    case DType::i32: return divide_plain<int32_t>(x, n, d);
    case DType::i64: return divide_plain<int64_t>(x, n, d);
    case DType::f16:
      return divide_16<gloo::float16>(
          x, n, d, [](gloo::float16 v) { return gloo::cpu_half2float(v); },
          [](float v) { return gloo::cpu_float2half_rn(v); });
    case DType::bf16:
      return divide_16<BFloat16>(
          x, n, d, [](BFloat16 v) { return static_cast<float>(v); }, [](float v) { return BFloat16(v); });
    default:
      TANDEM_CHECK(false, "all_reduce: dtype ", dtype_name(t), " cannot be averaged");
  }
}

}  // namespace tandem::dist::gloo_detail
