#pragma once
// Element types and the 16-bit float formats.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tandem {

/// Element type of a tensor.
enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

/// Bytes per element.
size_t dtype_size(DType t);
/// Short name: "f32", "f16", ...
const char* dtype_name(DType t);
/// Parses a short name ("f32", "float16", "bf16", ...); throws tandem::Error on an unknown one.
DType parse_dtype(std::string_view s);
/// True for f32, f64, f16, bf16.
bool is_floating(DType t);

/// IEEE half precision, stored as bits; converts to and from float with round-to-nearest-even.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f);
  explicit operator float() const;
};

/// bfloat16, stored as bits; converts from float with round-to-nearest-even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

/// The DType of a C++ element type.
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<Half>() { return DType::f16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

}  // namespace tandem
