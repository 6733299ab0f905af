// RMSNorm over the last dimension on the device: bf16 activations and gain, fp32 statistics.
//   forward:  rstd = 1/sqrt(mean(x²) + eps),  out = x · rstd · gain
//   backward: with x̂ = x · rstd, g = dout · gain:
//             dx    += rstd · (g − x̂ · mean(g · x̂))     (accumulates into bf16 dx)
//             dgain += Σ_rows dout · x̂                   (accumulates into f32 dgain)
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace pope::kernels {

cudaError_t rmsnorm_forward(__nv_bfloat16* out, float* rstd, const __nv_bfloat16* x, const __nv_bfloat16* gain,
                            int rows, int width, float eps, cudaStream_t stream);

// Widest row the backward handles (its per-block gain partials live in shared memory).
constexpr int kRmsnormMaxWidth = 8192;

// Bytes of scratch memory rmsnorm_backward needs (per-chunk gain partials).
std::size_t rmsnorm_backward_scratch_bytes(int rows, int width);

// dgain is reduced deterministically: fixed chunks of rows write partial sums to `scratch`,
// then a second kernel adds the chunks in order. dx must not alias dout or x.
cudaError_t rmsnorm_backward(__nv_bfloat16* dx, float* dgain, const __nv_bfloat16* dout, const __nv_bfloat16* x,
                             const __nv_bfloat16* gain, const float* rstd, int rows, int width, void* scratch,
                             std::size_t scratch_bytes, cudaStream_t stream);

}  // namespace pope::kernels
