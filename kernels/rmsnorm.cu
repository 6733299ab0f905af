// Forward: one warp per row (a row of GPT-2 width is a few KB: one warp streams it twice,
// the second read hitting L1), warp-shuffle sum of squares in fp32.
// Backward: one block per fixed chunk of kRowsPerChunk rows; its warps take the chunk's rows in
// turn (warp w: rows w, w + warps, …), each row reduced by warp shuffles alone, so the warps'
// rows are in flight side by side and no block barrier waits between rows (one block walking
// its rows one by one with a block-wide sum per row ran 3–5× under the memory bandwidth).
// Each lane adds its columns' dgain terms into its warp's row of partials in shared memory; at
// the end the block adds the warps' rows in warp order, and a second kernel adds the chunks'
// partials in a fixed order (sum_gain_partials_kernel). The chunking and the warps per block depend on the
// width alone, not on the GPU, so results are bitwise reproducible on any device.
// Both move rows in groups of kWidth columns (16-byte accesses where rows allow it).
#include <algorithm>

#include "bf16_group.cuh"
#include "block_reduce.cuh"
#include "rmsnorm.cuh"
#include "row_rms.cuh"

namespace pope::kernels {

namespace {

constexpr int kRowsPerChunk = 32;
constexpr int kForwardThreads = 256;  // 8 rows per block
constexpr int kBackwardWarps = 8;
constexpr std::size_t kBackwardShared = 48u << 10;  // the default per-block limit, no opt-in

int chunk_count(int rows) { return (rows + kRowsPerChunk - 1) / kRowsPerChunk; }

template <int kWidth>
__global__ void rmsnorm_forward_kernel(__nv_bfloat16* out, float* rstd, const __nv_bfloat16* x,
                                       const __nv_bfloat16* gain, int rows, int width, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // whole warps leave together: the shuffles below stay complete
  const int groups = width / kWidth;
  const __nv_bfloat16* x_row = x + std::size_t(row) * width;
  const float inverse_rms = warp_row_inverse_rms<kWidth>(x_row, width, eps);
  if (lane == 0) rstd[row] = inverse_rms;
  __nv_bfloat16* out_row = out + std::size_t(row) * width;
#pragma unroll 4
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
  // [warps][width]; warp w's row written by its lanes only, column g·kWidth + k at k·groups + g
  // so that a warp's lanes (consecutive g) touch consecutive banks.
  extern __shared__ float warp_partials[];
  const int warps = int(blockDim.x) / kWarpSize, warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  const int groups = width / kWidth;
  float* my_partials = warp_partials + std::size_t(warp) * width;
  for (int g = lane; g < groups; g += kWarpSize)  // zeroed by the lane that adds to it
    for (int k = 0; k < kWidth; ++k) my_partials[k * groups + g] = 0.0f;

  const int first = blockIdx.x * kRowsPerChunk;
  const int last = min(rows, first + kRowsPerChunk);
  for (int row = first + warp; row < last; row += warps) {
    const std::size_t base = std::size_t(row) * width;
    const float r = rstd[row];
    float dot = 0.0f;  // Σ_c (dout · gain) · x̂
#pragma unroll 4
    for (int g = lane; g < groups; g += kWarpSize) {
      const Bf16Group<kWidth> dy = load_group<kWidth>(dout + base, g), xs = load_group<kWidth>(x + base, g),
                              gains = load_group<kWidth>(gain, g);
      for (int k = 0; k < kWidth; ++k) dot += dy.get(k) * gains.get(k) * xs.get(k) * r;
    }
    const float mean = warp_reduce(dot, SumOp{}) / float(width);
#pragma unroll 4
    for (int g = lane; g < groups; g += kWarpSize) {
      const Bf16Group<kWidth> dy = load_group<kWidth>(dout + base, g), xs = load_group<kWidth>(x + base, g),
                              gains = load_group<kWidth>(gain, g);
      Bf16Group<kWidth> dxs = load_group<kWidth>(dx + base, g);
      for (int k = 0; k < kWidth; ++k) {
        const float x_hat = xs.get(k) * r;
        dxs.set(k, dxs.get(k) + r * (dy.get(k) * gains.get(k) - x_hat * mean));
        my_partials[k * groups + g] += dy.get(k) * x_hat;
      }
      store_group(dx + base, g, dxs);
    }
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < width; i += int(blockDim.x)) {
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += warp_partials[std::size_t(w) * width + i];
    const int g = i % groups, k = i / groups;
    gain_partials[std::size_t(blockIdx.x) * width + g * kWidth + k] = sum;
  }
}

// Warps per backward block: as many as kBackwardWarps whose partial rows fit kBackwardShared
// (GPT-2's 768 and 1280 columns: 8), at least one (kRmsnormMaxWidth: 32 KiB).
int backward_warps(int width) {
  const int fitting = int(kBackwardShared / (sizeof(float) * std::size_t(width)));
  return std::clamp(fitting, 1, kBackwardWarps);
}

// dgain[c] += Σ_chunks gain_partials[chunk][c] for a strip of kWarpSize columns per block, the
// chunks in kSumSlices slices (sliced_column_sum; one thread per column summing every chunk
// alone was latency-bound: a thousand dependent loads at GPT-2's 32,768 rows).
constexpr int kSumSlices = 32;
__global__ void sum_gain_partials_kernel(float* dgain, const float* gain_partials, int chunks, int width) {
  const int column = int(blockIdx.x) * kWarpSize + int(threadIdx.x);
  const float total = sliced_column_sum<kSumSlices>(column < width ? chunks : 0, [&](int chunk) {
    return gain_partials[std::size_t(chunk) * width + column];
  });
  if (threadIdx.y == 0 && column < width) dgain[column] += total;
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
  const int warps = backward_warps(width);
  const std::size_t shared_bytes = sizeof(float) * std::size_t(warps) * std::size_t(width);
  const cudaError_t status = launch_with_group_width(width, {dx, dout, x, gain}, [&](auto group) {
    rmsnorm_backward_kernel<decltype(group)::value><<<chunk_count(rows), warps * kWarpSize, shared_bytes, stream>>>(
        dx, gain_partials, dout, x, gain, rstd, rows, width);
    return cudaGetLastError();
  });
  if (status != cudaSuccess) return status;
  sum_gain_partials_kernel<<<(width + kWarpSize - 1) / kWarpSize, dim3(kWarpSize, kSumSlices), 0, stream>>>(
      dgain, gain_partials, chunk_count(rows), width);
  return cudaGetLastError();
}

}  // namespace pope::kernels
