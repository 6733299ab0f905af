// Argument validation of the FP8 ops (Backend::fp8_cast, fp8_update_scales, fp8_matmul), shared
// by the backends; a mismatch throws std::invalid_argument naming the op and the argument.
#pragma once

#include <cstdint>

#include "pope/tensor.hpp"

namespace pope::checks {

bool is_fp8(DType dtype);

struct Fp8CastShape {
  std::int64_t rows = 0, cols = 0;
  DType format = DType::e4m3;
};
// x [R, C] of x_dtype; out [R, C] and out_t [C, R] of one FP8 dtype, at least one of them; scale, amax f32 [1];
// pre [R, C] of x_dtype when expects_pre (the gelu_backward prologue), else empty.
Fp8CastShape check_fp8_cast(DeviceKind device, const Tensor& out, const Tensor& out_t, const Tensor& x, DType x_dtype,
                            const Tensor& scale, const Tensor& amax, const Tensor& pre, bool expects_pre);

// history f32 [k, L ≥ 1]; amax, scale f32 [k]; scale_inv f32 [k, kFp8FactorRow]; format e4m3 or e5m2. Returns k.
std::int64_t check_fp8_update(DeviceKind device, const Tensor& amax, const Tensor& history, const Tensor& scale,
                              const Tensor& scale_inv, DType format);

struct Fp8MatmulShape {
  std::int64_t m = 0, n = 0, k = 0;
};
// a [M, K], b [N, K] FP8, not both e5m2; factors f32 [1] or [1, kFp8FactorRow]; out [M, N] of out_dtype or f32;
// addend empty or as out.
Fp8MatmulShape check_fp8_matmul(DeviceKind device, const Tensor& out, const Tensor& a, const Tensor& a_scale_inv,
                                const Tensor& b, const Tensor& b_scale_inv, DType out_dtype, const Tensor& addend);

}  // namespace pope::checks
