// Elementwise ops on bf16 tensors of `count` elements: GELU (tanh approximation, as in
// GPT-2), its derivative, and addition. Arithmetic in fp32, one bf16 rounding per output.
// Outputs may alias inputs (each element is read before it is written, by one thread).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace pope::kernels {

// out = ½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))
cudaError_t gelu_forward(__nv_bfloat16* out, const __nv_bfloat16* x, std::size_t count, cudaStream_t stream);
// dx = dout · gelu'(x)
cudaError_t gelu_backward(__nv_bfloat16* dx, const __nv_bfloat16* dout, const __nv_bfloat16* x, std::size_t count,
                          cudaStream_t stream);
// out = a + b
cudaError_t add(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b, std::size_t count,
                cudaStream_t stream);

}  // namespace pope::kernels
