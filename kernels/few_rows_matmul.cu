// The few-rows product (few_rows_matmul.cuh): a block of kWarps warps takes kWarps consecutive
// output columns; each warp reads its weight row once in 16-byte groups and multiplies it with
// every input row (read from L1/L2, a few KB). With a fused norm every block first computes the
// rows' rstd (one warp per row), since the rows are tiny next to the weights. Launched as a
// dependent launch: a block prefetches its weight rows to L2 before it waits for the kernel
// before it.
#include <cstdint>
#include <type_traits>

#include "bf16_group.cuh"
#include "block_reduce.cuh"
#include "dependent_launch.cuh"
#include "few_rows_matmul.cuh"
#include "gelu.cuh"
#include "row_rms.cuh"

namespace pope::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kGroup = kVectorGroup;
constexpr int kL2Line = 128;  // bytes

template <int kRows, bool kNorm, FewRowsEpilogue kEpilogue, class Out>
__global__ void __launch_bounds__(kWarps * kWarpSize) few_rows_matmul_kernel(FewRowsMatmul p) {
  __shared__ float rstd[kRows];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int groups = p.k / kGroup;
  const int column = blockIdx.x * kWarps + warp;
  allow_dependents();
  // The weights are no earlier kernel's output: their row is on its way to L2 while the kernel
  // before finishes; x, the addend and the outputs wait for it.
  if (column < p.n) {
    const char* row = reinterpret_cast<const char*>(p.w + std::size_t(column) * p.k);
    for (int offset = lane * kL2Line; offset < p.k * int(sizeof(__nv_bfloat16)); offset += kWarpSize * kL2Line)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(row + offset));
  }
  wait_for_producer();
  if constexpr (kNorm) {
    for (int r = warp; r < p.rows; r += kWarps) {
      const float inverse_rms = warp_row_inverse_rms<kGroup>(p.x + std::size_t(r) * p.k, p.k, p.eps);
      if (lane == 0) rstd[r] = inverse_rms;
    }
    __syncthreads();
    if (blockIdx.x == 0) {  // the norm's outputs, for callers that keep them
      if (p.rstd_out != nullptr && threadIdx.x < p.rows) p.rstd_out[threadIdx.x] = rstd[threadIdx.x];
      if (p.norm_out != nullptr)
        for (int r = 0; r < p.rows; ++r)
          for (int g = int(threadIdx.x); g < groups; g += kWarps * kWarpSize) {
            const Bf16Group<kGroup> values = load_group<kGroup>(p.x + std::size_t(r) * p.k, g);
            const Bf16Group<kGroup> gains = load_group<kGroup>(p.gain, g);
            Bf16Group<kGroup> result;
            for (int e = 0; e < kGroup; ++e) result.set(e, values.get(e) * rstd[r] * gains.get(e));
            store_group(p.norm_out + std::size_t(r) * p.k, g, result);
          }
    }
  }
  if (column >= p.n) return;  // whole warps leave: the shuffles below stay complete
  const __nv_bfloat16* w_row = p.w + std::size_t(column) * p.k;
  float sum[kRows] = {};
#pragma unroll 4  // several weight groups in flight per lane
  for (int g = lane; g < groups; g += kWarpSize) {
    const Bf16Group<kGroup> weights = load_group<kGroup>(w_row, g);
    Bf16Group<kGroup> gains;
    if constexpr (kNorm) gains = load_group<kGroup>(p.gain, g);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= p.rows) break;
      const Bf16Group<kGroup> values = load_group<kGroup>(p.x + std::size_t(r) * p.k, g);
      for (int e = 0; e < kGroup; ++e) {
        float value = values.get(e);
        // as rmsnorm_forward stores it: bf16(x · rstd · gain)
        if constexpr (kNorm) value = __bfloat162float(__float2bfloat16_rn(value * rstd[r] * gains.get(e)));
        sum[r] += value * weights.get(e);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) sum[r] = warp_reduce(sum[r], SumOp{});
  if (lane != 0) return;
  for (int r = 0; r < p.rows; ++r) {
    const std::size_t at = std::size_t(r) * p.n + column;
    float value = sum[r];
    if constexpr (kEpilogue == FewRowsEpilogue::add) value += __bfloat162float(p.addend[at]);
    if constexpr (kEpilogue == FewRowsEpilogue::gelu) {
      p.aux[at] = __float2bfloat16_rn(value);
      value = gelu_tanh(value);
    }
    if constexpr (std::is_same_v<Out, float>) {
      static_cast<float*>(p.out)[at] = value;
    } else {
      static_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(value);
    }
  }
}

template <int kRows, bool kNorm, FewRowsEpilogue kEpilogue, class Out>
cudaError_t launch(const FewRowsMatmul& p, cudaStream_t stream) {
  const unsigned blocks = unsigned((p.n + kWarps - 1) / kWarps);
  return launch_dependent(few_rows_matmul_kernel<kRows, kNorm, kEpilogue, Out>, dim3(blocks), dim3(kWarps * kWarpSize),
                          stream, p);
}

template <int kRows, bool kNorm>
cudaError_t launch_epilogue(const FewRowsMatmul& p, cudaStream_t stream) {
  switch (p.epilogue) {
    case FewRowsEpilogue::none:
      return p.out_f32 ? launch<kRows, kNorm, FewRowsEpilogue::none, float>(p, stream)
                       : launch<kRows, kNorm, FewRowsEpilogue::none, __nv_bfloat16>(p, stream);
    case FewRowsEpilogue::add:
      return launch<kRows, kNorm, FewRowsEpilogue::add, __nv_bfloat16>(p, stream);
    case FewRowsEpilogue::gelu:
      return launch<kRows, kNorm, FewRowsEpilogue::gelu, __nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

// The row count rounded up to 1, 2, 4 or 8: the sums' registers; rows past p.rows are skipped.
template <bool kNorm>
cudaError_t launch_rows(const FewRowsMatmul& p, cudaStream_t stream) {
  if (p.rows <= 1) return launch_epilogue<1, kNorm>(p, stream);
  if (p.rows <= 2) return launch_epilogue<2, kNorm>(p, stream);
  if (p.rows <= 4) return launch_epilogue<4, kNorm>(p, stream);
  return launch_epilogue<8, kNorm>(p, stream);
}

bool aligned_or_null(const void* pointer) { return pointer == nullptr || aligned16(pointer); }

}  // namespace

bool few_rows_matmul_supports(const FewRowsMatmul& p) {
  return p.rows >= 1 && p.rows <= kFewRowsMax && p.n >= 1 && p.k >= kGroup && p.k % kGroup == 0 &&
         aligned16(p.x) && aligned16(p.w) && aligned_or_null(p.gain) && aligned_or_null(p.norm_out) &&
         (!p.out_f32 || p.epilogue == FewRowsEpilogue::none);
}

cudaError_t few_rows_matmul(const FewRowsMatmul& p, cudaStream_t stream) {
  if (!few_rows_matmul_supports(p)) return cudaErrorInvalidValue;
  return p.gain != nullptr ? launch_rows<true>(p, stream) : launch_rows<false>(p, stream);
}

}  // namespace pope::kernels
