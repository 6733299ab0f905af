#include "fill.cuh"

namespace pope::kernels {

namespace {
__global__ void fill_f32_kernel(float* data, std::size_t count, float value) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x)
    data[i] = value;
}
}  // namespace

cudaError_t fill_f32(float* data, std::size_t count, float value, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const std::size_t blocks = (count + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  fill_f32_kernel<<<grid, kThreads, 0, stream>>>(data, count, value);
  return cudaGetLastError();
}

}  // namespace pope::kernels
