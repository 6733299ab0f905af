// What a positional encoding asks of an attention backend, as plain data: the plan. A backend
// with fused kernels (CUDA) runs an encoding from its plan alone and never looks at the
// encoding's type; the CPU backend runs the encoding's own reference hooks instead and the
// tests hold the two against each other. docs/adding-an-encoding.md walks through a new one.
//
// A plan has two halves, either of which may be empty:
//   transform  how each head's q and k rows are encoded on load (q̃ = T_q(x, t), k̃ = T_k(x, s));
//   bias       a per-head Toeplitz score bias b_h(Δ), Δ = t − s ≥ 0, added after scaling,
//              with the gradient of its parameters taken from the diagonal sums
//              Ĝ_h(Δ) = Σ_batch Σ_{t−s=Δ} dL/da_ts.
// Parameters are named by their index in the encoding's layer_parameters().
#pragma once

#include <array>
#include <vector>

#include "pope/config_values.hpp"  // MagnitudeKind

namespace pope {

enum class TransformKind {
  identity,   // q̃ = q, k̃ = k
  rotary,     // half-split pairs (x_m, x_{m+P}) rotated by p·θ_m, optionally scaled (xPos)
  polar,      // PoPE: channel c → μ(x_c)·e^{i(p·ω_c + δ_c on keys)}, rows twice as wide
  jet_rotary  // PJ-rotary: blocks of K+1 complex channels, rotated and sheared
};

struct TransformPlan {
  TransformKind kind = TransformKind::identity;
  // rotary: θ_m for the P = frequencies.size() rotating pairs (channels past 2P pass through);
  // polar: ω_c for c = 0..d−1; jet_rotary: ω_m for the d / (2(K+1)) blocks.
  std::vector<double> frequencies;
  // rotary only, empty or one rate r_m per pair: queries are scaled by e^{r_m (t − centre)} and
  // keys by e^{−r_m (s − centre)}, so scores gain e^{r_m (t − s)} (xPos: r_m = ln ζ_m / γ < 0).
  std::vector<double> scale_rates;
  double scale_centre = 0.0;  // absolute position where both scales are 1
  // polar only.
  MagnitudeKind magnitude = MagnitudeKind::softplus;
  int delta_param = -1;  // index of δ [n_head, d] among the layer's parameters; −1: no δ
  bool clamp_delta = true;  // δ acts clamped to [−2π, 0], no gradient outside; false: as stored
  // jet_rotary only: jet order K and c_p = shear_rate · p.
  int jet_order = 0;
  double shear_rate = 0.0;
};

enum class BiasKind {
  none,
  linear,       // b_h(Δ) = slopes[h] · Δ, no parameters (ALiBi)
  host_table,   // parameter-free, tabulated by the encoding's score_bias hook on the host
  pj,           // PJ-bias: Fourier–jet, affine and light-cone sectors from the layer's parameters
  lag_buckets   // b_h(Δ) = w[h, bucket(Δ)] from one parameter w [n_head, buckets] (T5)
};

struct PjBiasPlan {
  int first_param = 0;  // its parameters follow PjParam's order from this index
  int order = 0;
  int train_length = 0;
  bool lightcone_rho = false;
  std::array<bool, 3> sectors{};  // Fourier–jet, affine, light-cone
};

struct LagBucketPlan {
  int param = 0;    // index of w [n_head, buckets]
  int buckets = 0;
  // For Δ = 0..T−1, bucket(Δ), non-decreasing in Δ so that each bucket is one run of lags.
  std::vector<int> bucket_of_lag;
};

struct BiasPlan {
  BiasKind kind = BiasKind::none;
  std::vector<double> slopes;  // linear: one per head
  PjBiasPlan pj;               // pj
  LagBucketPlan buckets;       // lag_buckets

  // Whether the table comes from learnable parameters (and Ĝ flows back into them).
  bool learned() const { return kind == BiasKind::pj || kind == BiasKind::lag_buckets; }
};

struct EncodingPlan {
  TransformPlan transform;
  BiasPlan bias;
};

}  // namespace pope
