#include "model/bf16.hpp"

#include <bit>
#include <cmath>

namespace pope {

std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  // A NaN whose payload sits only in the dropped bits would otherwise become infinity.
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  // Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then truncate.
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

float bf16_to_float(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

}  // namespace pope
