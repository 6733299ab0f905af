// One block per chunk; chunks are equal-sized pieces of segments, so the blocks carry equal
// work however uneven the segments are (the embedding is 10⁴× a norm gain). The guarded
// variant first derives its scalars on the device (one thread), so a recorded step needs no
// host value that changes from step to step.
#include "adamw.cuh"

#include <cstdint>

#include "grid.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 256;

// One element's update; every path below goes through it, so the vector and scalar paths give
// the same bits as each other and as the CPU reference.
__device__ __forceinline__ float updated_element(float theta, float grad, float& m, float& v, float decay,
                                                 const AdamWScalars& s) {
  const float g = grad * s.grad_scale;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  const float m_hat = m / s.correction1, v_hat = v / s.correction2;
  return theta - (decay * theta + s.lr * m_hat / (sqrtf(v_hat) + s.eps));
}

__device__ __forceinline__ void update_at(std::size_t i, float* __restrict__ params, const float* __restrict__ grads,
                                          float* __restrict__ m, float* __restrict__ v,
                                          __nv_bfloat16* __restrict__ compute_copy, float decay,
                                          const AdamWScalars& s) {
  float first = m[i], second = v[i];
  const float updated = updated_element(params[i], grads[i], first, second, decay, s);
  m[i] = first;
  v[i] = second;
  params[i] = updated;
  if (compute_copy != nullptr) compute_copy[i] = __float2bfloat16_rn(updated);
}

struct alignas(8) Bf16Quad {
  __nv_bfloat162 low, high;
};

// The update of the chunk this block owns. With kVectors (every array 16-byte aligned, which
// cudaMalloc'd arenas are), 16-byte loads and stores of four elements from the first index
// that is a multiple of 4, single elements before it and after the last whole group; else
// single elements throughout. The update is memory-bound: the vectors keep enough bytes in
// flight to approach the DRAM bandwidth, which single-element accesses did not (3.3 TB/s for
// 774M parameters).
template <bool kVectors>
__device__ void update_chunk(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ m,
                             float* __restrict__ v, __nv_bfloat16* __restrict__ compute_copy, const AdamWChunk& chunk,
                             const AdamWScalars& s) {
  const float decay = chunk.weight_decay ? s.decay : 0.0f;
  const std::size_t begin = std::size_t(chunk.offset), end = begin + std::size_t(chunk.numel);
  const std::size_t vector_begin = kVectors ? min(end, (begin + 3) / 4 * 4) : end;
  const std::size_t vector_end = kVectors ? max(vector_begin, end / 4 * 4) : end;
  for (std::size_t i = begin + threadIdx.x; i < vector_begin; i += blockDim.x)
    update_at(i, params, grads, m, v, compute_copy, decay, s);
  for (std::size_t i = vector_end + threadIdx.x; i < end; i += blockDim.x)
    update_at(i, params, grads, m, v, compute_copy, decay, s);
  for (std::size_t q = vector_begin / 4 + threadIdx.x; q < vector_end / 4; q += blockDim.x) {
    float4 theta = reinterpret_cast<const float4*>(params)[q];
    const float4 grad = reinterpret_cast<const float4*>(grads)[q];
    float4 first = reinterpret_cast<const float4*>(m)[q], second = reinterpret_cast<const float4*>(v)[q];
    theta.x = updated_element(theta.x, grad.x, first.x, second.x, decay, s);
    theta.y = updated_element(theta.y, grad.y, first.y, second.y, decay, s);
    theta.z = updated_element(theta.z, grad.z, first.z, second.z, decay, s);
    theta.w = updated_element(theta.w, grad.w, first.w, second.w, decay, s);
    reinterpret_cast<float4*>(m)[q] = first;
    reinterpret_cast<float4*>(v)[q] = second;
    reinterpret_cast<float4*>(params)[q] = theta;
    if (compute_copy != nullptr)
      reinterpret_cast<Bf16Quad*>(compute_copy)[q] = {__floats2bfloat162_rn(theta.x, theta.y),
                                                      __floats2bfloat162_rn(theta.z, theta.w)};
  }
}

template <bool kVectors>
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                             const AdamWChunk* chunks, AdamWScalars s) {
  update_chunk<kVectors>(params, grads, m, v, compute_copy, chunks[blockIdx.x], s);
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

template <bool kVectors>
__global__ void adamw_guarded_kernel(float* params, const float* grads, float* m, float* v,
                                     __nv_bfloat16* compute_copy, const AdamWChunk* chunks,
                                     const AdamWDeviceScalars* device_scalars) {
  if (!device_scalars->apply) return;  // the same value for every thread: no divergence
  const AdamWScalars s = device_scalars->scalars;
  update_chunk<kVectors>(params, grads, m, v, compute_copy, chunks[blockIdx.x], s);
}

// Whether every array the update touches allows the 16-byte path.
bool vectors_allowed(const float* params, const float* grads, const float* m, const float* v,
                     const __nv_bfloat16* compute_copy) {
  return aligned16(params) && aligned16(grads) && aligned16(m) && aligned16(v) &&
         (compute_copy == nullptr || reinterpret_cast<std::uintptr_t>(compute_copy) % 8 == 0);
}

}  // namespace

cudaError_t adamw(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                  const AdamWChunk* chunks, int chunk_count, AdamWScalars scalars, cudaStream_t stream) {
  if (chunk_count == 0) return cudaSuccess;
  if (vectors_allowed(params, grads, m, v, compute_copy))
    adamw_kernel<true><<<chunk_count, kThreads, 0, stream>>>(params, grads, m, v, compute_copy, chunks, scalars);
  else
    adamw_kernel<false><<<chunk_count, kThreads, 0, stream>>>(params, grads, m, v, compute_copy, chunks, scalars);
  return cudaGetLastError();
}

cudaError_t adamw_guarded(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                          const AdamWChunk* chunks, int chunk_count, AdamWGuardSettings settings,
                          const double* schedule, double* stats, AdamWDeviceScalars* scratch, cudaStream_t stream) {
  adamw_guard_kernel<<<1, 1, 0, stream>>>(settings, schedule, stats, scratch);
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  if (chunk_count == 0) return cudaSuccess;
  if (vectors_allowed(params, grads, m, v, compute_copy))
    adamw_guarded_kernel<true><<<chunk_count, kThreads, 0, stream>>>(params, grads, m, v, compute_copy, chunks, scratch);
  else
    adamw_guarded_kernel<false><<<chunk_count, kThreads, 0, stream>>>(params, grads, m, v, compute_copy, chunks, scratch);
  return cudaGetLastError();
}

}  // namespace pope::kernels
