#include "block_reduce.cuh"
#include "reduce.cuh"

namespace pope::kernels {

namespace {

constexpr int kBlocks = 1024;  // also the thread count of the final block
constexpr int kThreads = 256;

__global__ void partial_sum_of_squares_kernel(double* partials, const float* x, std::size_t count) {
  __shared__ double reduce_scratch[kWarpSize];
  double sum = 0.0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const double value = x[i];
    sum += value * value;
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
