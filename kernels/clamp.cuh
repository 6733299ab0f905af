// Clamping f32 values in place: x[i] = min(max(x[i], lowest), highest), NaN kept, as
// std::clamp does on the CPU; the optimizer's projection of bounded parameters (PoPE's δ under
// delta_bound project). Tested against the CPU by tests/gpu/test_cuda_ops.cpp
// (`pope_gpu_tests --gtest_filter='CudaOps.Clamp*'`).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace pope::kernels {

cudaError_t clamp_f32(float* x, std::size_t count, float lowest, float highest, cudaStream_t stream);

}  // namespace pope::kernels
