// One block per chunk; chunks are equal-sized pieces of segments, so the blocks carry equal
// work however uneven the segments are (the embedding is 10⁴× a norm gain).
#include "adamw.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 256;

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                             const AdamWChunk* chunks, AdamWScalars s) {
  const AdamWChunk chunk = chunks[blockIdx.x];
  const float decay = chunk.weight_decay ? s.decay : 0.0f;
  for (int j = threadIdx.x; j < chunk.numel; j += blockDim.x) {
    const std::size_t i = std::size_t(chunk.offset) + j;
    const float g = grads[i] * s.grad_scale;
    const float first = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float second = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    m[i] = first;
    v[i] = second;
    const float m_hat = first / s.correction1, v_hat = second / s.correction2;
    const float theta = params[i];
    const float updated = theta - (decay * theta + s.lr * m_hat / (sqrtf(v_hat) + s.eps));
    params[i] = updated;
    if (compute_copy != nullptr) compute_copy[i] = __float2bfloat16_rn(updated);
  }
}

}  // namespace

cudaError_t adamw(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                  const AdamWChunk* chunks, int chunk_count, AdamWScalars scalars, cudaStream_t stream) {
  if (chunk_count == 0) return cudaSuccess;
  adamw_kernel<<<chunk_count, kThreads, 0, stream>>>(params, grads, m, v, compute_copy, chunks, scalars);
  return cudaGetLastError();
}

}  // namespace pope::kernels
