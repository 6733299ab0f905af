// One warp's 1/rms of a bf16 row: rstd = 1/sqrt(mean(x²) + eps), summed in the same order by
// every kernel that includes it (rmsnorm_forward, the few-rows matmul's fused norm), so that a
// norm computed inside a product equals the standalone norm bit for bit.
#pragma once

#include <cuda_bf16.h>

#include "bf16_group.cuh"
#include "block_reduce.cuh"

namespace pope::kernels {

// Every lane of the warp calls it and receives the same value. width is a multiple of kWidth.
template <int kWidth>
__device__ float warp_row_inverse_rms(const __nv_bfloat16* x_row, int width, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int groups = width / kWidth;
  float sum_squares = 0.0f;
#pragma unroll 4  // a row's loads issued together (GPT-2's 768 columns: 3 groups per lane)
  for (int g = lane; g < groups; g += kWarpSize) {
    const Bf16Group<kWidth> values = load_group<kWidth>(x_row, g);
    for (int k = 0; k < kWidth; ++k) sum_squares += values.get(k) * values.get(k);
  }
  sum_squares = warp_reduce(sum_squares, SumOp{});
  return 1.0f / sqrtf(sum_squares / float(width) + eps);
}

}  // namespace pope::kernels
