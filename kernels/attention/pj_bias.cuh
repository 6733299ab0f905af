// The PJ-bias on the GPU (spec positional-encodings.md, section 5.1): the per-head bias
// table b_h(Δ) a fused attention kernel adds to its scores, and the parameter gradients
// from the diagonal sums Ĝ_h(Δ) = Σ_batch Σ_{t−s=Δ} dS_ts that kernel produces. Plain data
// only (no pope/*.hpp): host files (C++20) and kernels (C++17) both include it.
//
// Definitions are those of the CPU oracle (src/core/pj_bias_math.*): every lag is evaluated
// in fp64 from the f32 parameters and the table stored in f32, so the GPU table equals the
// CPU float table up to the last f32 rounding. The cost is O(H·T·K) per layer and call,
// nothing next to the attention itself.
#pragma once

#include <cuda_runtime.h>

namespace pope::kernels {

// Largest jet order K (core/position_methods.hpp's kMaxPjOrder; the two must agree).
constexpr int kPjBiasMaxOrder = 15;

// Slots of one layer's PJ-bias parameters, in PjBiasEncoding::layer_parameters() order.
enum PjBiasSlot : int {
  kPjSlotOmega,          // [H]
  kPjSlotGateLogits,     // [H, 3]  (FJ, affine, LC)
  kPjSlotFjOrderLogits,  // [H, K+1]
  kPjSlotFjRe,           // [H, K+1]
  kPjSlotFjIm,           // [H, K+1]
  kPjSlotFjDamping,      // [H]
  kPjSlotAffineSlope,    // [H]
  kPjSlotLcOrderLogits,  // [H, K+1]
  kPjSlotLcRe,           // [H, K+1]
  kPjSlotLcIm,           // [H, K+1]
  kPjSlotCount
};

struct PjBiasParams {
  int n_head = 0;
  int order = 0;                    // K, at most kPjBiasMaxOrder
  int train_length = 0;             // L
  bool lightcone_rho = false;       // ρ = asinh(Δ/L) instead of Δ/L
  bool sector_enabled[3] = {};      // FJ, affine, LC (at least one)
  const float* values[kPjSlotCount] = {};  // device f32, one pointer per slot
};

// Gradient buffers (device f32, same slots and shapes), ACCUMULATED into.
struct PjBiasGradients {
  float* values[kPjSlotCount] = {};
};

// table[h·T + Δ] = b_h(Δ) for h < n_head, Δ < seq_len (device f32 [n_head, seq_len]).
// Returns cudaErrorInvalidValue for an order past kPjBiasMaxOrder, no enabled sector, or
// non-positive sizes.
cudaError_t pj_bias_table(const PjBiasParams& params, int seq_len, float* table, cudaStream_t stream);

// gradients += Σ_Δ diag_grad[h·T + Δ]·∂b_h(Δ)/∂θ for every parameter θ of every head.
// Deterministic: one block per head, each thread a fixed stride of lags in fp64, then
// fixed-shape block sums; the result does not depend on the GPU or on scheduling.
cudaError_t pj_bias_backward(const PjBiasParams& params, int seq_len, const float* diag_grad,
                             const PjBiasGradients& gradients, cudaStream_t stream);

}  // namespace pope::kernels
