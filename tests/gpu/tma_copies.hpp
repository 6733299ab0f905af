// Device entry of the TMA building-block test (tma_copies.cu; see test_tma.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace pope::testing {

// What one CTA copies with TMA (kernels/attention/tma.cuh) from
//   matrix: bf16 [groups][rows][columns] with the given row and group strides (elements);
//   vector: f32 [count];
// the box of 64 rows × `panels` 64-column panels at (row0, group) of the matrix, as the kernels'
// swizzled tile (tile: panels · 64 · 64 bf16, shared-memory order), and the 64-float runs of the
// vector starting at first[0] and first[1] (runs: 128 floats; `vector` need only be 4-byte aligned). *supported = 1 when built with
// sm_90 code, else 0 and nothing else is written. cudaErrorInvalidValue when a map is refused.
cudaError_t tma_copies(const __nv_bfloat16* matrix, std::int64_t columns, std::int64_t rows, std::int64_t groups,
                       std::int64_t row_stride, std::int64_t group_stride, int panels, int row0, int group,
                       const float* vector, std::int64_t count, const int (&first)[2], __nv_bfloat16* tile,
                       float* runs, int* supported);

}  // namespace pope::testing
