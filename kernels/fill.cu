#include "fill.cuh"
#include "grid.cuh"

namespace pope::kernels {

namespace {

template <class T> __global__ void fill_kernel(T* data, std::size_t count, T value) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x)
    data[i] = value;
}

template <class T> cudaError_t launch_fill(T* data, std::size_t count, T value, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  fill_kernel<<<grid_stride_blocks(count, kThreads), kThreads, 0, stream>>>(data, count, value);
  return cudaGetLastError();
}

}  // namespace

cudaError_t fill_f32(float* data, std::size_t count, float value, cudaStream_t stream) {
  return launch_fill(data, count, value, stream);
}
cudaError_t fill_f64(double* data, std::size_t count, double value, cudaStream_t stream) {
  return launch_fill(data, count, value, stream);
}
cudaError_t fill_i32(std::int32_t* data, std::size_t count, std::int32_t value, cudaStream_t stream) {
  return launch_fill(data, count, value, stream);
}
cudaError_t fill_u16(std::uint16_t* data, std::size_t count, std::uint16_t value, cudaStream_t stream) {
  return launch_fill(data, count, value, stream);
}

}  // namespace pope::kernels
