#include "tandem/dtype.h"

#include "tandem/error.h"

namespace tandem {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "float") return DType::f32;
  if (s == "f64" || s == "float64" || s == "double") return DType::f64;
  if (s == "f16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "i32" || s == "int32") return DType::i32;
  if (s == "i64" || s == "int64") return DType::i64;
  if (s == "u8" || s == "uint8") return DType::u8;
  TANDEM_CHECK(false, "unknown dtype '", s, "' (expected f32, f64, f16, bf16, i32, i64 or u8)");
}

bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }

// IEEE binary16 conversions, round to nearest even, with subnormals, infinities and NaN.
Half::Half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) {  // NaN
    bits = static_cast<uint16_t>(sign | 0x7e00u);
    return;
  }
  if (absx >= 0x477ff000u) {  // rounds to infinity (>= 65520)
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (absx < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (absx < 0x33000000u) {  // below half of the smallest subnormal (2^-25)
      bits = static_cast<uint16_t>(sign);
      return;
    }
    uint32_t exp = absx >> 23;
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // value = mant * 2^(exp-150) = q * 2^-24
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) q++;
    bits = static_cast<uint16_t>(sign | q);
    return;
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t q = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;  // may carry into the exponent: correct
  bits = static_cast<uint16_t>(sign | q);
}

Half::operator float() const {
  uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        mant <<= 1;
        e++;
      } while (!(mant & 0x400u));
      mant &= 0x3ffu;
      out = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace tandem
