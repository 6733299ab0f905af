// The positional encodings' per-channel math on the device, in fp32 (spec
// docs/encodings.md, sections 2, 3 and 5.2; CPU reference in src/position/rope.cpp,
// pope.cpp and pj_rotary.cpp). Small __device__ functions so that the simple attention path
// (qk_transform.cu) and a fused attention kernel evaluate exactly the same formulas.
#pragma once

#include <cuda_runtime.h>

#include "attention/attention_params.cuh"

namespace pope::kernels {

struct PhaseRotation {
  float cos;
  float sin;
};

// cos and sin of `angle`, formed in double. Why: p·ω reaches ~16000 rad at long context,
// where a float angle is only accurate to ~1e-3 rad. Reducing to [−π, π] in double first
// leaves a float angle whose cos and sin the hardware's __sincosf gives to ~4e-7 absolute
// error on that range (about the float rounding of the angle itself, 2e-7), as the CPU
// reference forms the angle in double too. (sincosf's own range reduction, with its slow path
// for large arguments, had nothing left to do; the transform kernels are bound by their
// instructions, and this is one per channel and slice of sequences.) The quotient by 2π is a
// product with its reciprocal: rint of it is the same integer but where angle/2π lies within
// an ulp of a half-integer, and either neighbour then leaves |reduced| ≤ π + 1e-12.
__device__ inline PhaseRotation rotation_by(double angle) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr double kInverseTwoPi = 0.15915494309189533576888376337251;
  const double reduced = fma(-kTwoPi, rint(angle * kInverseTwoPi), angle);
  PhaseRotation r;
  __sincosf(static_cast<float>(reduced), &r.sin, &r.cos);
  return r;
}

// RoPE: the pair (a, b) rotated by +angle.
__device__ inline void rotate_pair(float a, float b, PhaseRotation r, float& out_a, float& out_b) {
  out_a = a * r.cos - b * r.sin;
  out_b = a * r.sin + b * r.cos;
}

// Backward of rotate_pair: the pair's gradient rotated back by −angle.
__device__ inline void unrotate_pair(float grad_a, float grad_b, PhaseRotation r, float& da, float& db) {
  da = grad_a * r.cos + grad_b * r.sin;
  db = -grad_a * r.sin + grad_b * r.cos;
}

// A function's value f(x) and derivative f'(x) at one x, for the passes that need both.
struct ValueAndDerivative {
  float value;
  float derivative;
};

// softplus(x) = log(1 + e^x) and its derivative σ(x) = 1 / (1 + e^−x), both from one exponential
// t = e^−|x| ∈ (0, 1]:  softplus(x) = max(x, 0) + log1p(t),  σ(x) = (x ≥ 0 ? 1 : t) / (1 + t).
// Why not log1pf(expf(x)) and 1 / (1 + expf(−x)): PoPE's encode and δ passes are bound by the
// instructions spent per element here, not by memory, and those spend two full-range exponentials
// and a full log1pf. log1p(t) is a series for t ≤ 1/8 (eight terms: the first left out is below
// 2e−8 of the sum) and above it the hardware log2 of u = 1 + t, corrected for the rounding of u
// by (t − (u − 1)) / u; relative error below 4e−6 (tested against double precision over
// [−30, 30] and out to ±80). For x below ~−87 t underflows and softplus returns 0 where e^x is
// subnormal.
__device__ inline ValueAndDerivative softplus_parts(float x) {
  constexpr float kSeriesUpTo = 0.125f;
  constexpr float kLn2 = 0.693147180559945309f;
  const float t = expf(-fabsf(x));
  float log1p_t;
  if (t <= kSeriesUpTo) {
    // t − t²/2 + t³/3 − … − t⁸/8 by Horner's rule.
    float series = -1.0f / 8.0f;
    series = fmaf(series, t, 1.0f / 7.0f);
    series = fmaf(series, t, -1.0f / 6.0f);
    series = fmaf(series, t, 1.0f / 5.0f);
    series = fmaf(series, t, -1.0f / 4.0f);
    series = fmaf(series, t, 1.0f / 3.0f);
    series = fmaf(series, t, -1.0f / 2.0f);
    series = fmaf(series, t, 1.0f);
    log1p_t = series * t;
  } else {
    const float u = 1.0f + t;
    log1p_t = fmaf(__log2f(u), kLn2, __fdividef(t - (u - 1.0f), u));
  }
  const float reciprocal = __fdividef(1.0f, 1.0f + t);
  return {fmaxf(x, 0.0f) + log1p_t, x >= 0.0f ? reciprocal : t * reciprocal};
}

// PoPE magnitude μ = f(x) and its derivative dμ/dx, for passes that need both (the δ pass):
// softplus's pair comes from one exponential, not two.
__device__ inline ValueAndDerivative pope_magnitude_parts(PopeMagnitudeKind kind, float x) {
  switch (kind) {
    case PopeMagnitudeKind::softplus:
      return softplus_parts(x);
    case PopeMagnitudeKind::relu:
      return x > 0.0f ? ValueAndDerivative{x, 1.0f} : ValueAndDerivative{0.0f, 0.0f};
    case PopeMagnitudeKind::identity:
      break;
  }
  return {x, 1.0f};
}

// PoPE magnitudes μ = f(x).
__device__ inline float pope_magnitude(PopeMagnitudeKind kind, float x) { return pope_magnitude_parts(kind, x).value; }

// dμ/dx of the function pope_magnitude computes.
__device__ inline float pope_magnitude_derivative(PopeMagnitudeKind kind, float x) {
  return pope_magnitude_parts(kind, x).derivative;
}

// A clamped δ acts clamped to [−2π, 0]; outside that range it gets no gradient (on the bounds
// it does). An unclamped one (delta_bound none) acts as stored and always gets its gradient.
constexpr double kPopeDeltaLowest = -6.283185307179586476925286766559;
__device__ inline bool pope_delta_in_range(float delta) { return delta >= kPopeDeltaLowest && delta <= 0.0; }
__device__ inline double pope_acting_delta(bool clamped, float delta) {
  return clamped ? fmin(fmax(double(delta), kPopeDeltaLowest), 0.0) : double(delta);
}
__device__ inline bool pope_delta_passes_gradient(bool clamped, float delta) {
  return !clamped || pope_delta_in_range(delta);
}

// Phase of channel c at position p: p·ω_c, plus the acting δ_c on keys (pass has_delta false for queries).
__device__ inline PhaseRotation pope_phase(double position, double omega, bool has_delta, bool clamped, float delta) {
  return rotation_by(position * omega + (has_delta ? pope_acting_delta(clamped, delta) : 0.0));
}

// Backward through y = (μ cos φ, μ sin φ) given its gradient (g_re, g_im):
//   dμ = g_re cos φ + g_im sin φ,   dφ = μ (−g_re sin φ + g_im cos φ)  (= dδ for keys).
__device__ inline float pope_magnitude_grad(float grad_re, float grad_im, PhaseRotation r) {
  return grad_re * r.cos + grad_im * r.sin;
}
__device__ inline float pope_phase_grad(float magnitude, float grad_re, float grad_im, PhaseRotation r) {
  return magnitude * (-grad_re * r.sin + grad_im * r.cos);
}

// PJ-rotary's shear at one position (spec 5.2): exp(c N) for queries, exp(−c Nᵀ) for keys,
// N the (K+1)×(K+1) nilpotent upper shift. Both are Toeplitz in the jet powers
// power[n] = (±c)^n / n!, so a block's transform is y = S z and its adjoint dz = Sᵀ w with
//   query  S(out, in) = power[in − out]   for in ≥ out   (c^n/n!)
//   key    S(out, in) = power[out − in]   for in ≤ out   ((−c)^n/n!)
// and 0 elsewhere. kChannels bounds K + 1 at compile time, so that callers can keep the
// powers (and their channels) in registers with loops unrolled to kChannels.
template <int kChannels>
struct PjShear {
  float power[kChannels];
  bool is_key;

  __device__ PjShear(double c, int channels, bool key) : is_key(key) {
    const float signed_c = static_cast<float>(key ? -c : c);
    power[0] = 1.0f;
#pragma unroll
    for (int n = 1; n < kChannels; ++n) power[n] = n < channels ? power[n - 1] * signed_c / float(n) : 0.0f;
  }

  __device__ float at(int out, int in) const {
    const int n = is_key ? out - in : in - out;
    float value = 0.0f;
#pragma unroll
    for (int k = 0; k < kChannels; ++k) value = k == n ? power[k] : value;  // a select per k: stays in registers
    return value;
  }
};

}  // namespace pope::kernels
