// Elementwise fill of device memory; the first brick of the CUDA backend and the kernel
// the GPU smoke test runs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace pope::kernels {

// data[i] = value for i < count; one thread per element, grid-stride loop.
cudaError_t fill_f32(float* data, std::size_t count, float value, cudaStream_t stream);

}  // namespace pope::kernels
