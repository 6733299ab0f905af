// Per-tensor scaled FP8 for the GEMMs of train.precision = "fp8" (docs/design.md, "FP8 GEMMs"):
//   q = fp8(saturate(x · scale)),   x ≈ q · scale_inv,   scale_inv = 1 / scale,
// e4m3 (max 448) for weights and activations, e5m2 (max 57,344) for gradients. cuBLASLt's FP8
// kernels take both operands K-major (the "TN" layout), so a cast can also write the transpose.
// The amax (max |x|) of every cast is folded into a running f32 amax; a NaN or an infinity
// makes it NaN or +inf, which the scale update then skips, keeping the last good scale.
// Tested against a host reference by tests/gpu/test_cuda_fp8.cpp
// (`pope_gpu_tests --gtest_filter='CudaFp8*'`).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace pope::kernels {

enum class Fp8Format : int { e4m3, e5m2 };

// The largest finite value of the format: 448 (e4m3) or 57,344 (e5m2).
constexpr float fp8_max(Fp8Format format) { return format == Fp8Format::e4m3 ? 448.0f : 57344.0f; }

// What a cast applies to its input first: nothing, GELU, or GELU's backward (x · gelu'(pre)).
enum class Fp8CastPrologue : int { none, gelu, gelu_backward };

// out[r, c] = fp8(v[r, c] · *scale) and out_t[c, r] the same value (either may be null), rounding
// to nearest and saturating at ±fp8_max(format); *amax = max(*amax, max |v|) (amax may be null).
// v = x, bf16(gelu(x)) or bf16(x · gelu'(pre)) by the prologue: the values gelu_forward or
// gelu_backward (elementwise.cuh) would store, so a fused cast equals the unfused pair bit for bit.
cudaError_t fp8_cast_transpose_bf16(const __nv_bfloat16* x, std::int64_t rows, std::int64_t cols, Fp8Format format,
                                    const float* scale, std::uint8_t* out, std::uint8_t* out_t, float* amax,
                                    cudaStream_t stream, Fp8CastPrologue prologue = Fp8CastPrologue::none,
                                    const __nv_bfloat16* pre = nullptr);

// Delayed scaling of `count` tensors, one format: for each tensor i with a finite amax[i], push it
// into history[i, 0 .. length) (newest first), and where the history's max m > 0 set
//   scale[i] = fp8_max / m / 2^margin,   scale_inv[i · factor_row] = 1 / scale[i];
// a non-finite amax leaves history and scale alone. amax[i] is reset to 0 for the next step.
// With the update run between a cast that measures the amax and the cast that is used, this is
// current scaling (the scale of this step's own amax).
cudaError_t fp8_update_scales(float* amax, float* history, int length, float* scale, float* scale_inv,
                              int factor_row, int count, Fp8Format format, int margin, cudaStream_t stream);

}  // namespace pope::kernels
