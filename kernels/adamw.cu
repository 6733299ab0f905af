// One block per chunk; chunks are equal-sized pieces of segments, so the blocks carry equal
// work however uneven the segments are (the embedding is 10⁴× a norm gain). The guarded
// variant first derives its scalars on the device (one thread), so a recorded step needs no
// host value that changes from step to step.
#include "adamw.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 256;

// The update of the chunk this block owns.
__device__ void update_chunk(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                             const AdamWChunk& chunk, const AdamWScalars& s) {
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

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                             const AdamWChunk* chunks, AdamWScalars s) {
  update_chunk(params, grads, m, v, compute_copy, chunks[blockIdx.x], s);
}

// One thread: the same conversions the host does for adamw() (float of each double value,
// decay = lr · weight_decay in fp32), so both variants give the same bits.
__global__ void adamw_guard_kernel(AdamWGuardSettings settings, const double* schedule, double* stats,
                                   AdamWDeviceScalars* out) {
  const double norm = sqrt(stats[kGuardStatsGradSquares]);
  const int apply = isfinite(stats[kGuardStatsLossSum]) && isfinite(norm) ? 1 : 0;
  AdamWScalars s{};
  s.lr = float(schedule[kGuardScheduleLr]);
  s.beta1 = settings.beta1;
  s.beta2 = settings.beta2;
  s.eps = settings.eps;
  s.one_minus_beta1 = settings.one_minus_beta1;
  s.one_minus_beta2 = settings.one_minus_beta2;
  s.grad_scale = float(settings.grad_clip > 0.0 && norm > settings.grad_clip ? settings.grad_clip / norm : 1.0);
  s.correction1 = float(schedule[kGuardScheduleCorrection1]);
  s.correction2 = float(schedule[kGuardScheduleCorrection2]);
  s.decay = __fmul_rn(s.lr, settings.weight_decay);  // no contraction: the host multiplies in fp32 too
  out->scalars = s;
  out->apply = apply;
  stats[kGuardStatsApplied] = apply;
}

__global__ void adamw_guarded_kernel(float* params, const float* grads, float* m, float* v,
                                     __nv_bfloat16* compute_copy, const AdamWChunk* chunks,
                                     const AdamWDeviceScalars* device_scalars) {
  if (!device_scalars->apply) return;  // the same value for every thread: no divergence
  const AdamWScalars s = device_scalars->scalars;
  update_chunk(params, grads, m, v, compute_copy, chunks[blockIdx.x], s);
}

}  // namespace

cudaError_t adamw(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                  const AdamWChunk* chunks, int chunk_count, AdamWScalars scalars, cudaStream_t stream) {
  if (chunk_count == 0) return cudaSuccess;
  adamw_kernel<<<chunk_count, kThreads, 0, stream>>>(params, grads, m, v, compute_copy, chunks, scalars);
  return cudaGetLastError();
}

cudaError_t adamw_guarded(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                          const AdamWChunk* chunks, int chunk_count, AdamWGuardSettings settings,
                          const double* schedule, double* stats, AdamWDeviceScalars* scratch, cudaStream_t stream) {
  adamw_guard_kernel<<<1, 1, 0, stream>>>(settings, schedule, stats, scratch);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  if (chunk_count == 0) return cudaSuccess;
  adamw_guarded_kernel<<<chunk_count, kThreads, 0, stream>>>(params, grads, m, v, compute_copy, chunks, scratch);
  return cudaGetLastError();
}

}  // namespace pope::kernels
