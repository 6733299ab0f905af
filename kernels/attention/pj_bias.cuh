// The PJ-bias on the GPU (docs/encodings.md, section 5.1): the per-head bias
// table b_h(Δ) a fused attention kernel adds to its scores, and the parameter gradients
// from the diagonal sums Ĝ_h(Δ) = Σ_batch Σ_{t−s=Δ} dS_ts that kernel produces. Plain data
// only (no pope/*.hpp): host files (C++20) and kernels (C++17) both include it.
//
// Definitions are those of the CPU oracle (src/position/pj_bias_math.*): every lag is evaluated
// in fp64 from the f32 parameters and the table stored in f32, so the GPU table equals the
// CPU float table up to the last f32 rounding. The cost is O(H·T·K) per layer and call: at the
// 124M shape 8.5 µs (table) and 14 µs (backward) next to ~900 µs of attention kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace pope::kernels {

// Largest jet order K (position/registry.hpp's kMaxPjOrder; the two must agree).
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

// Doubles of the scratch pj_bias_backward needs for this call (0 for invalid parameters).
std::size_t pj_bias_backward_partial_doubles(const PjBiasParams& params, int seq_len);

// gradients += Σ_Δ diag_grad[h·T + Δ]·∂b_h(Δ)/∂θ for every parameter θ of every head.
// `partials`: device scratch of pj_bias_backward_partial_doubles() doubles. Deterministic: a
// block per (head, 256 lags) sums its lags' fp64 terms in a fixed shape into `partials`, then a
// thread per (head, parameter) adds the blocks' sums in order; the result does not depend on
// the GPU or on scheduling.
cudaError_t pj_bias_backward(const PjBiasParams& params, int seq_len, const float* diag_grad,
                             const PjBiasGradients& gradients, double* partials, cudaStream_t stream);

}  // namespace pope::kernels
