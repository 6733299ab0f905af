// Forward: one warp per row (a row of GPT-2 width is a few KB: one warp streams it twice,
// the second read hitting L1), warp-shuffle sum of squares in fp32.
// Backward: one block per fixed chunk of kRowsPerChunk rows; the block walks its rows in
// order, each thread owning the same columns throughout, so its dgain partials (in shared
// memory) need no synchronisation and are summed in row order. A second kernel adds the
// chunks' partials column by column in chunk order. The chunking does not depend on the
// GPU, so results are bitwise reproducible on any device.
// Both move rows in groups of kWidth columns (16-byte accesses where rows allow it).
#include <algorithm>

#include "bf16_group.cuh"
#include "block_reduce.cuh"
#include "rmsnorm.cuh"

namespace pope::kernels {

namespace {

constexpr int kRowsPerChunk = 32;
constexpr int kForwardThreads = 256;  // 8 rows per block
constexpr int kMaxBackwardThreads = 256;
constexpr int kReduceThreads = 256;

int chunk_count(int rows) { return (rows + kRowsPerChunk - 1) / kRowsPerChunk; }

template <int kWidth>
__global__ void rmsnorm_forward_kernel(__nv_bfloat16* out, float* rstd, const __nv_bfloat16* x,
                                       const __nv_bfloat16* gain, int rows, int width, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // whole warps leave together: the shuffles below stay complete
  const int groups = width / kWidth;
  const __nv_bfloat16* x_row = x + std::size_t(row) * width;
  float sum_squares = 0.0f;
  for (int g = lane; g < groups; g += kWarpSize) {
    const Bf16Group<kWidth> values = load_group<kWidth>(x_row, g);
    for (int k = 0; k < kWidth; ++k) sum_squares += values.get(k) * values.get(k);
  }
  sum_squares = warp_reduce(sum_squares, SumOp{});
  const float inverse_rms = 1.0f / sqrtf(sum_squares / float(width) + eps);
  if (lane == 0) rstd[row] = inverse_rms;
  __nv_bfloat16* out_row = out + std::size_t(row) * width;
  for (int g = lane; g < groups; g += kWarpSize) {
    const Bf16Group<kWidth> values = load_group<kWidth>(x_row, g), gains = load_group<kWidth>(gain, g);
    Bf16Group<kWidth> result;
    for (int k = 0; k < kWidth; ++k) result.set(k, values.get(k) * inverse_rms * gains.get(k));
    store_group(out_row, g, result);
  }
}

template <int kWidth>
__global__ void rmsnorm_backward_kernel(__nv_bfloat16* dx, float* gain_partials, const __nv_bfloat16* dout,
                                        const __nv_bfloat16* x, const __nv_bfloat16* gain, const float* rstd,
                                        int rows, int width) {
  extern __shared__ float gain_partial[];  // [width]; group g's columns owned by thread g % blockDim.x
  __shared__ float reduce_scratch[kWarpSize];
  const int groups = width / kWidth;
  for (int g = threadIdx.x; g < groups; g += blockDim.x)
    for (int k = 0; k < kWidth; ++k) gain_partial[g * kWidth + k] = 0.0f;

  const int first = blockIdx.x * kRowsPerChunk;
  const int last = min(rows, first + kRowsPerChunk);
  for (int row = first; row < last; ++row) {
    const std::size_t base = std::size_t(row) * width;
    const float r = rstd[row];
    float dot = 0.0f;  // Σ_c (dout · gain) · x̂
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
      const Bf16Group<kWidth> dy = load_group<kWidth>(dout + base, g), xs = load_group<kWidth>(x + base, g),
                              gains = load_group<kWidth>(gain, g);
      for (int k = 0; k < kWidth; ++k) dot += dy.get(k) * gains.get(k) * xs.get(k) * r;
    }
    const float mean = block_sum(dot, reduce_scratch) / float(width);
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
      const Bf16Group<kWidth> dy = load_group<kWidth>(dout + base, g), xs = load_group<kWidth>(x + base, g),
                              gains = load_group<kWidth>(gain, g);
      Bf16Group<kWidth> dxs = load_group<kWidth>(dx + base, g);
      for (int k = 0; k < kWidth; ++k) {
        const float x_hat = xs.get(k) * r;
        dxs.set(k, dxs.get(k) + r * (dy.get(k) * gains.get(k) - x_hat * mean));
        gain_partial[g * kWidth + k] += dy.get(k) * x_hat;
      }
      store_group(dx + base, g, dxs);
    }
  }
  for (int g = threadIdx.x; g < groups; g += blockDim.x)
    for (int k = 0; k < kWidth; ++k)
      gain_partials[std::size_t(blockIdx.x) * width + g * kWidth + k] = gain_partial[g * kWidth + k];
}

__global__ void sum_gain_partials_kernel(float* dgain, const float* gain_partials, int chunks, int width) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  float sum = 0.0f;
  for (int chunk = 0; chunk < chunks; ++chunk) sum += gain_partials[std::size_t(chunk) * width + c];
  dgain[c] += sum;
}

}  // namespace

cudaError_t rmsnorm_forward(__nv_bfloat16* out, float* rstd, const __nv_bfloat16* x, const __nv_bfloat16* gain,
                            int rows, int width, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  constexpr int kRowsPerBlock = kForwardThreads / kWarpSize;
  const int blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  return launch_with_group_width(width, {out, x, gain}, [&](auto group) {
    rmsnorm_forward_kernel<decltype(group)::value><<<blocks, kForwardThreads, 0, stream>>>(out, rstd, x, gain, rows,
                                                                                          width, eps);
    return cudaGetLastError();
  });
}

std::size_t rmsnorm_backward_scratch_bytes(int rows, int width) {
  return sizeof(float) * std::size_t(chunk_count(rows)) * std::size_t(width);
}

cudaError_t rmsnorm_backward(__nv_bfloat16* dx, float* dgain, const __nv_bfloat16* dout, const __nv_bfloat16* x,
                             const __nv_bfloat16* gain, const float* rstd, int rows, int width, void* scratch,
                             std::size_t scratch_bytes, cudaStream_t stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  if (width > kRmsnormMaxWidth || scratch_bytes < rmsnorm_backward_scratch_bytes(rows, width))
    return cudaErrorInvalidValue;
  auto* gain_partials = static_cast<float*>(scratch);
  const std::size_t shared_bytes = sizeof(float) * std::size_t(width);
  const cudaError_t status = launch_with_group_width(width, {dx, dout, x, gain}, [&](auto group) {
    // One thread per group up to kMaxBackwardThreads (GPT-2's 768 columns: 96 threads), so no
    // thread idles and more blocks fit on a multiprocessor.
    const int groups = width / decltype(group)::value;
    const int threads = std::min(kMaxBackwardThreads, (groups + kWarpSize - 1) / kWarpSize * kWarpSize);
    rmsnorm_backward_kernel<decltype(group)::value><<<chunk_count(rows), threads, shared_bytes, stream>>>(
        dx, gain_partials, dout, x, gain, rstd, rows, width);
    return cudaGetLastError();
  });
  if (status != cudaSuccess) return status;
  sum_gain_partials_kernel<<<(width + kReduceThreads - 1) / kReduceThreads, kReduceThreads, 0, stream>>>(
      dgain, gain_partials, chunk_count(rows), width);
  return cudaGetLastError();
}

}  // namespace pope::kernels
