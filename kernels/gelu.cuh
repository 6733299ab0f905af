// GELU, tanh approximation, and its derivative, in fp32 on the device: one definition for the
// elementwise kernels and the few-rows matmul's epilogue.
#pragma once

namespace pope::kernels {

constexpr float kGeluScale = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluCubic = 0.044715f;

__device__ inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x)));
}

__device__ inline float gelu_tanh_derivative(float x) {
  const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
  const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du_dx;
}

}  // namespace pope::kernels
