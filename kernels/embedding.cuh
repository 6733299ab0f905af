// Token embedding on the device: forward gathers rows of the bf16 table, backward adds bf16
// output gradients into the f32 table gradient deterministically.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "device_error.cuh"

namespace pope::kernels {

// out[n, :] = table[tokens[n], :] for n < rows; table has vocab_rows rows of `width`. A token
// outside [0, vocab_rows) is recorded in `error` and its output row is filled with NaN.
cudaError_t embedding_forward(__nv_bfloat16* out, const int* tokens, const __nv_bfloat16* table, int rows,
                              int width, int vocab_rows, DeviceErrorRecord* error, cudaStream_t stream);

// Bytes of scratch memory embedding_backward needs for `rows` tokens.
cudaError_t embedding_backward_scratch_bytes(int rows, std::size_t* bytes);

// dtable[tokens[n], :] += dout[n, :] for n < rows, summing the rows of each token in
// position order, so the result is bitwise reproducible. Out-of-range tokens are recorded
// in `error` and skipped. `scratch` holds embedding_backward_scratch_bytes(rows) bytes.
cudaError_t embedding_backward(float* dtable, const __nv_bfloat16* dout, const int* tokens, int rows, int width,
                               int vocab_rows, void* scratch, std::size_t scratch_bytes, DeviceErrorRecord* error,
                               cudaStream_t stream);

}  // namespace pope::kernels
