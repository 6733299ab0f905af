#include "model/fp8.hpp"

#include <cmath>
#include <stdexcept>

namespace pope {

namespace {

struct Fp8Layout {
  int mantissa_bits, bias;
  std::uint8_t max_code;  // the largest finite magnitude's bits
};

Fp8Layout layout_of(DType format) {
  switch (format) {
    case DType::e4m3: return {3, 7, 0x7E};
    case DType::e5m2: return {2, 15, 0x7B};
    default: throw std::invalid_argument("fp8: expected an e4m3 or e5m2 dtype");
  }
}

}  // namespace

float fp8_max_value(DType format) { return fp8_to_float(layout_of(format).max_code, format); }

std::uint8_t float_to_fp8(float value, DType format) {
  const Fp8Layout f = layout_of(format);
  if (std::isnan(value)) return 0x7F;
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double a = std::fabs(double(value));
  if (a >= fp8_to_float(f.max_code, format)) return sign | f.max_code;
  const int M = f.mantissa_bits, min_exponent = 1 - f.bias;
  int exponent = std::ilogb(a);  // a = m · 2^exponent, 1 ≤ m < 2 (a > 0)
  if (a == 0.0 || exponent < min_exponent) {
    // Subnormal: units of 2^(min_exponent − M); rounding up to 2^M units is the smallest normal.
    const double units = std::nearbyint(std::ldexp(a, M - min_exponent));
    return sign | std::uint8_t(units);
  }
  double mantissa = std::nearbyint(std::ldexp(a, M - exponent));  // in [2^M, 2^(M+1)]
  if (mantissa == std::ldexp(1.0, M + 1)) {
    mantissa = std::ldexp(1.0, M);
    ++exponent;
  }
  const int code = ((exponent + f.bias) << M) | (int(mantissa) - (1 << M));
  return sign | std::uint8_t(code > f.max_code ? f.max_code : code);
}

float fp8_to_float(std::uint8_t bits, DType format) {
  const Fp8Layout f = layout_of(format);
  const int M = f.mantissa_bits;
  const int magnitude = bits & 0x7F, exponent = magnitude >> M, mantissa = magnitude & ((1 << M) - 1);
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  if (format == DType::e4m3 && magnitude == 0x7F) return std::nanf("");
  if (format == DType::e5m2 && exponent == 31) return mantissa == 0 ? sign * INFINITY : std::nanf("");
  if (exponent == 0) return sign * float(std::ldexp(double(mantissa), 1 - f.bias - M));
  return sign * float(std::ldexp(double(mantissa + (1 << M)), exponent - f.bias - M));
}

}  // namespace pope
