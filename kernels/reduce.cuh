// Σ x² over an f32 tensor on the device (the global gradient norm), and a running sum of f32
// values (the loss of a training step), both in fp64 and deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace pope::kernels {

// Bytes of scratch memory sum_of_squares needs (one fp64 partial per block).
std::size_t sum_of_squares_scratch_bytes();

// *result (device memory) = Σ_i x[i]², deterministic: a fixed grid of blocks, each summing a
// fixed grid-stride set of elements in fp64, then one block adding the partials in a fixed
// tree. The grid does not depend on the GPU, so neither do the bits of the result.
cudaError_t sum_of_squares(double* result, const float* x, std::size_t count, void* scratch,
                           std::size_t scratch_bytes, cudaStream_t stream);

// *total (device memory) += Σ_i values[i], one block of a fixed size summing a fixed
// block-stride set of elements in fp64 and then adding them in a fixed tree, so the bits do
// not depend on the GPU. Meant for per-token losses (B·T values): one block is enough.
cudaError_t accumulate_sum(double* total, const float* values, std::size_t count, cudaStream_t stream);

}  // namespace pope::kernels
