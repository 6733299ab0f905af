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

// The fixed settings of adamw_guarded, converted once on the host.
struct AdamWGuardSettings {
  float beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;
  float weight_decay;
  double grad_clip;  // > 0: clip the global norm to it
};

// Where adamw_guarded finds its per-step values (f64 arrays; the host side checks that these
// match pope's StepScheduleSlot and StepStatsSlot).
constexpr int kGuardScheduleLr = 0, kGuardScheduleCorrection1 = 1, kGuardScheduleCorrection2 = 2;
constexpr int kGuardStatsLossSum = 0, kGuardStatsGradSquares = 1, kGuardStatsApplied = 2;

// Device scratch of adamw_guarded: the scalars one thread derives for the whole update.
struct AdamWDeviceScalars {
  AdamWScalars scalars;
  int apply;  // 0: the loss or the norm was not finite; nothing is updated
};

// Updates params, m, v for the elements the chunks cover (arena padding stays untouched) and,
// when compute_copy is not null, writes those updated weights to it as bf16.
cudaError_t adamw(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                  const AdamWChunk* chunks, int chunk_count, AdamWScalars scalars, cudaStream_t stream);

// adamw() with lr, bias corrections and the clip factor read from device memory: one thread
// derives them from schedule[] and stats[] into *scratch (grad_scale = min(1, clip/√squares)
// in double, as on the host) and sets stats[kGuardStatsApplied] to 1, or to 0 when the loss
// sum or the norm is not finite, in which case the update kernel changes nothing.
cudaError_t adamw_guarded(float* params, const float* grads, float* m, float* v, __nv_bfloat16* compute_copy,
                          const AdamWChunk* chunks, int chunk_count, AdamWGuardSettings settings,
                          const double* schedule, double* stats, AdamWDeviceScalars* scratch, cudaStream_t stream);

}  // namespace pope::kernels
