// Device entry of the wgmma building-block test (wgmma_products.cu; see test_wgmma.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace pope::testing {

// One warpgroup on device buffers: s = a · bᵀ (a, b: 64 × 128 row major, both K-major operands
// over two 64-column panels), o = p · v (p: 64 × 64 from registers, v: 64 × 64 as an N-major
// operand) and u = pᵀ · v (p as an M-major operand from shared memory); s, o, u: 64 × 64 f32
// row major. *supported = 1 when the kernel was built for sm_90a
// (wgmma), else 0 and nothing else is written.
cudaError_t wgmma_products(const __nv_bfloat16* a, const __nv_bfloat16* b, const __nv_bfloat16* p,
                           const __nv_bfloat16* v, float* s, float* o, float* u, int* supported);

}  // namespace pope::testing
