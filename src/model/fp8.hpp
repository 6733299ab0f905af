// FP8 ↔ f32 on the host, the formats of train.precision = "fp8": e4m3 (OCP E4M3FN: bias 7, no
// infinities, max 448) and e5m2 (bias 15, max 57,344). The CPU backend's FP8 ops use these as the
// reference the GPU's are tested against, so they round as the GPU's cvt.rn.satfinite does: to
// nearest even, values past the max (infinities too) to ±max, NaN to 0x7F.
#pragma once

#include <cstdint>

#include "pope/tensor.hpp"

namespace pope {

// The largest finite value of an FP8 dtype (e4m3 or e5m2); throws std::invalid_argument otherwise.
float fp8_max_value(DType format);

std::uint8_t float_to_fp8(float value, DType format);
float fp8_to_float(std::uint8_t bits, DType format);

}  // namespace pope
