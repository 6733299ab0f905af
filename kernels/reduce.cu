#include "block_reduce.cuh"
#include "reduce.cuh"

#include <cstdint>

namespace pope::kernels {

namespace {

constexpr int kBlocks = 1024;  // also the thread count of the final block
constexpr int kThreads = 256;

// Block b's part of Σ x²: the 16-byte groups from the first 16-byte boundary on, grid-strided
// and read as float4 (single floats kept too few bytes in flight to reach the DRAM bandwidth),
// plus the < 4 elements before the boundary and the < 4 after the last whole group, which the
// first block's threads take one each.
__global__ void partial_sum_of_squares_kernel(double* partials, const float* __restrict__ x, std::size_t count) {
  __shared__ double reduce_scratch[kWarpSize];
  const std::size_t misaligned = (reinterpret_cast<std::uintptr_t>(x) / sizeof(float)) % 4;
  const std::size_t head = min(count, (4 - misaligned) % 4);
  const std::size_t groups = (count - head) / 4, tail_begin = head + 4 * groups;
  const float4* body = reinterpret_cast<const float4*>(x + head);
  double sum = 0.0;
  for (std::size_t g = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; g < groups;
       g += std::size_t(gridDim.x) * blockDim.x) {
    const float4 q = body[g];
    sum += (double(q.x) * q.x + double(q.y) * q.y) + (double(q.z) * q.z + double(q.w) * q.w);
  }
  if (blockIdx.x == 0) {
    if (threadIdx.x < head) sum += double(x[threadIdx.x]) * x[threadIdx.x];
    const std::size_t t = tail_begin + threadIdx.x % 4;
    if (threadIdx.x >= 4 && threadIdx.x < 8 && t < count) sum += double(x[t]) * x[t];
  }
  sum = block_sum(sum, reduce_scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void sum_partials_kernel(double* result, const double* partials) {
  __shared__ double reduce_scratch[kWarpSize];
  const double total = block_sum(partials[threadIdx.x], reduce_scratch);
  if (threadIdx.x == 0) *result = total;
}

__global__ void accumulate_sum_kernel(double* total, const float* values, std::size_t count) {
  __shared__ double reduce_scratch[kWarpSize];
  double sum = 0.0;
  for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) sum += values[i];
  sum = block_sum(sum, reduce_scratch);
  if (threadIdx.x == 0) *total += sum;
}

}  // namespace

cudaError_t accumulate_sum(double* total, const float* values, std::size_t count, cudaStream_t stream) {
  accumulate_sum_kernel<<<1, kBlocks, 0, stream>>>(total, values, count);
  return cudaGetLastError();
}

std::size_t sum_of_squares_scratch_bytes() { return sizeof(double) * kBlocks; }

cudaError_t sum_of_squares(double* result, const float* x, std::size_t count, void* scratch,
                           std::size_t scratch_bytes, cudaStream_t stream) {
  if (scratch_bytes < sum_of_squares_scratch_bytes()) return cudaErrorInvalidValue;
  auto* partials = static_cast<double*>(scratch);
  partial_sum_of_squares_kernel<<<kBlocks, kThreads, 0, stream>>>(partials, x, count);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  sum_partials_kernel<<<1, kBlocks, 0, stream>>>(result, partials);
  return cudaGetLastError();
}

}  // namespace pope::kernels
