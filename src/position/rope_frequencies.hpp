// RoPE's frequency table and its context-extension scalings (docs/encodings.md,
// section 2). Every scaling is expressed as a change of the per-pair frequencies θ'_m, so
// positions are always the plain absolute positions and one rotation routine serves all:
//   none         θ_m = base^(−2m/r)                      (r = rotating channels; r = d by default)
//   pi           θ'_m = θ_m / s                           (same as p → p/s)
//   ntk          base' = base · s^(r/(r−2))
//   dynamic_ntk  ntk with s = max(1, T/L_train), T = the last position + 1 of this call
//   yarn         θ'_m = (1 − γ_m)·θ_m/s + γ_m·θ_m, γ_m = clamp((r_m − α)/(β − α), 0, 1),
//                r_m = L_train·θ_m/(2π); logits × t² with t = 0.1·ln s + 1 (or the configured t)
// The spec writes NTK's exponent as d/(d−2); with partial rotation the rotating width r
// plays d's role (the two agree at fraction 1). PJ-RoPE's rope_pi/rope_ntk/rope_yarn reuse this.
#pragma once

#include <vector>

#include "pope/config.hpp"

namespace pope {

// Throws ConfigError naming the "model.position.rope.*" key when an option is out of range.
void validate_rope_config(const RopeConfig& config);

// r = fraction·head_dim; throws ConfigError on "model.position.rope.fraction" unless r is a
// positive even integer ≤ head_dim.
int rope_rotary_dim(double fraction, int head_dim);

// The scale factor s in effect: 1 for none, the configured factor for pi/ntk/yarn,
// max(1, total_length/train_length) for dynamic_ntk.
double rope_scale_factor(const RopeScalingConfig& scaling, int train_length, int total_length);

// θ'_m for m = 0..rotary_dim/2 − 1 under `config.scaling`. train_length is L_train,
// total_length the number of positions the call covers (position_offset + seq_len).
std::vector<double> rope_frequencies(const RopeConfig& config, int rotary_dim, int train_length, int total_length);

// YaRN's q/k multiplier t (1 for every other scaling): logits are multiplied by t².
double rope_qk_multiplier(const RopeScalingConfig& scaling);

}  // namespace pope
