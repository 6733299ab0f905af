// Products of a few activation rows with a weight matrix, as decoding computes them: one new
// token per sequence leaves a GEMM of M ≤ kFewRowsMax rows, which cuBLASLt runs as a split-K
// GEMM plus a reduction kernel, each a few µs of launch-bound work. Here one kernel streams the
// weights once:
//   out[M, N] = epilogue(x̂ · wᵀ),  x [M, K], w [N, K] (row-major, as the model stores them)
//   x̂ = x, or with `gain` set the RMSNorm of x fused into the prologue: rstd = 1/rms(x) per row
//   (summed as rmsnorm_forward sums it) and x̂ = bf16(x · rstd · gain), the bf16 value
//   rmsnorm_forward stores; `norm_out`/`rstd_out`, when set, receive x̂ and rstd.
//   epilogue none: out = P (bf16 or f32); add: out = P + addend; gelu: aux = P, out = gelu(P).
// One warp per output column, each lane summing 8-column groups of K in f32, then a warp
// shuffle: the result does not depend on the GPU. bf16 x, w, addend, aux.
// Test: pope_gpu_tests --gtest_filter='CudaFewRows*' (against the CPU backend).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace pope::kernels {

constexpr int kFewRowsMax = 8;

enum class FewRowsEpilogue { none, add, gelu };

struct FewRowsMatmul {
  int rows = 0, n = 0, k = 0;
  const __nv_bfloat16* x = nullptr;
  const __nv_bfloat16* w = nullptr;
  void* out = nullptr;
  bool out_f32 = false;  // else bf16; f32 only with FewRowsEpilogue::none
  FewRowsEpilogue epilogue = FewRowsEpilogue::none;
  const __nv_bfloat16* addend = nullptr;  // add: [rows, n]
  __nv_bfloat16* aux = nullptr;           // gelu: [rows, n], the pre-activation
  const __nv_bfloat16* gain = nullptr;    // [k]: normalise x first
  float eps = 0.0f;
  __nv_bfloat16* norm_out = nullptr;  // [rows, k] or null
  float* rstd_out = nullptr;          // [rows] or null
};

// Whether the kernel takes the product: 1..kFewRowsMax rows, k a multiple of 8 and x, w (and
// gain, norm_out) 16-byte aligned, f32 output only without an epilogue.
bool few_rows_matmul_supports(const FewRowsMatmul& args);

cudaError_t few_rows_matmul(const FewRowsMatmul& args, cudaStream_t stream);

}  // namespace pope::kernels
