// bf16 ↔ f32 on the host, for every layer that reads or writes bf16 bits (host copies of
// tensors, fills, the CPU backend's conversions). bf16 is the upper half of an f32, rounded to
// nearest even (NaN stays NaN).
#pragma once

#include <cstdint>

namespace pope {

std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);

}  // namespace pope
