#include "clamp.cuh"
#include "grid.cuh"

namespace pope::kernels {

namespace {

// std::clamp's comparisons, so that a NaN fails both and stays.
__global__ void clamp_f32_kernel(float* x, std::size_t count, float lowest, float highest) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    x[i] = v < lowest ? lowest : highest < v ? highest : v;
  }
}

}  // namespace

cudaError_t clamp_f32(float* x, std::size_t count, float lowest, float highest, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  clamp_f32_kernel<<<grid_stride_blocks(count, kThreads), kThreads, 0, stream>>>(x, count, lowest, highest);
  return cudaGetLastError();
}

}  // namespace pope::kernels
