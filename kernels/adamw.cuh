// AdamW over the whole f32 parameter arena in one launch (see cpu_optimizer.cpp for the
// update rule). Work is described by a table of chunks, each a piece of one segment of at
// most kAdamWChunkElements elements; the host builds it once per segment list.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace pope::kernels {

constexpr long long kAdamWChunkElements = 1 << 16;

struct AdamWChunk {
  long long offset;  // first element in the arena
  int numel;         // at most kAdamWChunkElements
  int weight_decay;  // 1 when the segment is decayed
};

// Every scalar in fp32, computed once on the host exactly as the CPU reference does.
struct AdamWScalars {
  float lr, beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;
  float grad_scale;
  float correction1, correction2;  // 1 − β^step
  float decay;                     // lr · weight_decay, applied on decayed segments
};

// Updates params, m, v for the elements the chunks cover (arena padding stays untouched) and,
// when compute_copy is not null, writes those updated weights to it as bf16.
cudaError_t adamw(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                  const AdamWChunk* chunks, int chunk_count, AdamWScalars scalars, cudaStream_t stream);

}  // namespace pope::kernels
