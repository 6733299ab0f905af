// Conversions between natural and log2 units, for kernels that take exponentials as exp2 (one
// FFMA to scale and shift, then the hardware's exp2) and logarithms as log2.
#pragma once

namespace pope::kernels {

constexpr float kLog2e = 1.4426950408889634f;  // log2 e: x nats = x·log2 e bits
constexpr float kLn2 = 0.69314718055994531f;   // ln 2: back from log2 units

}  // namespace pope::kernels
