// Plain data the host hands the attention kernels: sizes, the q/k transform of the layer's
// positional encoding, and what turns a dot product into a score. No device code here, so
// host files (g++, C++20) and kernels (nvcc, C++17) both include it.
//
// Layouts (row-major): qkv bf16 [B·T, 3C] with q, k, v in column blocks of C = H·d and head
// h at h·d; out/dout bf16 [B·T, C]; lse f32 [B, H, T]; encoded rows q̃, k̃ and their
// gradients f32 [B, H, T, qk_width].
#pragma once

#include <cstdint>

#include "pope/position_plan.hpp"

namespace pope::kernels {

struct AttentionDims {
  int batch = 0;
  int seq_len = 0;
  int n_head = 0;
  int head_dim = 0;  // d of q, k, v
  int qk_width = 0;  // width of q̃, k̃ (2d for PoPE, else d)
};

enum class QkTransformKind : int { identity, rope, pope, pj_rotary };
using PopeMagnitudeKind = ::pope::MagnitudeKind;

// Largest PJ-rotary jet order K (position/registry.hpp's kMaxPjOrder; the two must agree).
constexpr int kPjRotaryMaxOrder = 15;

// The encoding's q/k transform (docs/encodings.md, sections 2, 3 and 5.2).
struct QkTransformParams {
  QkTransformKind kind = QkTransformKind::identity;
  int position_offset = 0;              // absolute position of row 0
  // When set, row 0's absolute position is read from this device int instead: a decode step
  // recorded once (a CUDA graph) and replayed at every new position.
  const int* position_offset_at = nullptr;
  int rotary_pairs = 0;                 // rope: pairs (m, m + rotary_pairs) rotate, later channels pass
  const double* frequencies = nullptr;  // rope: θ'_m [rotary_pairs]; pope: ω_c [head_dim];
                                        // pj_rotary: ω_m [head_dim / (2(K+1))]
  PopeMagnitudeKind magnitude = PopeMagnitudeKind::softplus;  // pope
  const float* delta = nullptr;                               // pope keys: δ [n_head, head_dim], or null without δ
  bool clamp_delta = true;  // pope: δ acts clamped to [−2π, 0], no gradient outside; false: as stored
  int jet_order = 0;                    // pj_rotary: K, blocks of K+1 complex channels (≤ kPjRotaryMaxOrder)
  double shear_rate = 0.0;              // pj_rotary: η / L_train, so that the shear is c_p = shear_rate · p
  // rope: (cos, sin) of p_t · frequency_m for the call's rows t, [seq_len][rotary_pairs]
  // (fill_phase_table), or null: computed per (position, pair).
  const float2* phases = nullptr;
  // rope, optional (xPos): per pair r_m; queries are scaled by e^{r_m (p − scale_centre)}, keys
  // by e^{−r_m (p − scale_centre)}. Needs the tables: `phases` then holds the queries' scaled
  // (cos, sin) and `key_phases` the keys' (fill_phase_table fills both).
  const double* scale_rates = nullptr;
  double scale_centre = 0.0;
  const float2* key_phases = nullptr;
};

// a_ts = <q̃_t, k̃_s> · scale + bias[h·T + (t − s)] for s ≤ t.
struct ScoreParams {
  float scale = 1.0f;
  const float* bias = nullptr;  // [n_head, seq_len] table b_h(Δ), or null
  // [n_head] or null: the table is linear, b_h(Δ) = bias_slopes[h] · Δ (ALiBi), and kernels that
  // can compute it from the lag do so instead of reading the table (the fused W = 64 kernels);
  // the table must be there too, for the others.
  const float* bias_slopes = nullptr;
};

}  // namespace pope::kernels
