// Elementwise fill of device memory; the first brick of the CUDA backend and the kernel
// the GPU smoke test runs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pope::kernels {

// data[i] = value for i < count; one thread per element, grid-stride loop.
cudaError_t fill_f32(float* data, std::size_t count, float value, cudaStream_t stream);
cudaError_t fill_f64(double* data, std::size_t count, double value, cudaStream_t stream);
cudaError_t fill_i32(std::int32_t* data, std::size_t count, std::int32_t value, cudaStream_t stream);
// 16-bit elements by bit pattern: u16 values, and bf16 values already rounded on the host.
cudaError_t fill_u16(std::uint16_t* data, std::size_t count, std::uint16_t value, cudaStream_t stream);

}  // namespace pope::kernels
