#include "attention/pj_bias.cuh"
#include "block_reduce.cuh"

namespace pope::kernels {

namespace {

constexpr int kTableThreads = 256;
constexpr int kBackwardThreads = 256;
constexpr int kMaxOrders = kPjBiasMaxOrder + 1;
constexpr int kFj = 0, kAffine = 1, kLc = 2;

// softplus with the CPU's linear tail above 20, and its derivative.
__device__ double softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
__device__ double softplus_derivative(double x) { return x > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-x)); }

// The FJ and LC sectors have one form, Σ_r α_r basis_r(Δ) Re(ζ_r e^{iθ(Δ)}), and differ only in
// the basis (damped jet vs β^r) and the phase (ωΔ vs ωφ): the three structs below hold one such
// sector's parameters, its terms at one lag and its gradient partials.
struct Oscillator {
  double alpha[kMaxOrders], re[kMaxOrders], im[kMaxOrders];  // order weights (softmax), ζ_r
};
struct OscillatorTerms {
  double cos, sin;                                  // of the phase θ
  double basis[kMaxOrders], real[kMaxOrders];       // basis_r, Re(ζ_r e^{iθ})
};
struct OscillatorPartials {
  double order[kMaxOrders], re[kMaxOrders], im[kMaxOrders];  // ∂/∂(order logits, Re ζ, Im ζ)
};

// One head's parameters after softmaxes and softplus (disabled sectors: gate exactly 0).
struct Head {
  int orders;
  double omega, damping, damping_slope, slope, slope_slope;
  double gate[3];
  Oscillator fj, lc;
};

__device__ void softmax(const float* logits, int count, const bool* keep, double* out) {
  double top = -1e300;
  for (int i = 0; i < count; ++i)
    if (keep == nullptr || keep[i]) top = fmax(top, double(logits[i]));
  double total = 0.0;
  for (int i = 0; i < count; ++i) {
    out[i] = (keep == nullptr || keep[i]) ? exp(double(logits[i]) - top) : 0.0;
    total += out[i];
  }
  for (int i = 0; i < count; ++i) out[i] /= total;
}

__device__ Head resolve_head(const PjBiasParams& p, int h) {
  Head head;
  const int n = p.order + 1;
  head.orders = n;
  head.omega = p.values[kPjSlotOmega][h];
  const double damping_raw = p.values[kPjSlotFjDamping][h];
  head.damping = softplus(damping_raw);
  head.damping_slope = softplus_derivative(damping_raw);
  const double slope_raw = p.values[kPjSlotAffineSlope][h];
  head.slope = softplus(slope_raw);
  head.slope_slope = softplus_derivative(slope_raw);
  softmax(p.values[kPjSlotGateLogits] + 3 * h, 3, p.sector_enabled, head.gate);
  softmax(p.values[kPjSlotFjOrderLogits] + n * h, n, nullptr, head.fj.alpha);
  softmax(p.values[kPjSlotLcOrderLogits] + n * h, n, nullptr, head.lc.alpha);
  for (int r = 0; r < n; ++r) {
    head.fj.re[r] = p.values[kPjSlotFjRe][n * h + r];
    head.fj.im[r] = p.values[kPjSlotFjIm][n * h + r];
    head.lc.re[r] = p.values[kPjSlotLcRe][n * h + r];
    head.lc.im[r] = p.values[kPjSlotLcIm][n * h + r];
  }
  return head;
}

// Every term of b_h at one lag (as PjLag on the CPU).
struct Lag {
  double lag, x, rho, phi;
  OscillatorTerms fj, lc;
  double sector[3];
  double bias;
};

// Sets terms.real from the phase and returns the sector's value Σ_r α_r basis_r real_r (the
// basis already set by the caller).
__device__ double evaluate_oscillator(int orders, const Oscillator& sector, OscillatorTerms& terms) {
  double value = 0.0;
  for (int r = 0; r < orders; ++r) {
    terms.real[r] = sector.re[r] * terms.cos - sector.im[r] * terms.sin;
    value += sector.alpha[r] * terms.basis[r] * terms.real[r];
  }
  return value;
}

__device__ void clear_oscillator(int orders, OscillatorTerms& terms) {
  terms.cos = 1.0, terms.sin = 0.0;
  for (int r = 0; r < orders; ++r) terms.basis[r] = terms.real[r] = 0.0;
}

__device__ void evaluate_lag(const PjBiasParams& p, const Head& head, int lag, Lag& t) {
  const double L = p.train_length;
  t.lag = lag;
  t.x = lag / L;
  t.rho = p.lightcone_rho ? asinh(t.x) : t.x;
  t.phi = L * asinh(t.x);
  const double beta = lag / sqrt(double(lag) * lag + L * L);
  t.sector[kFj] = t.sector[kAffine] = t.sector[kLc] = 0.0;
  clear_oscillator(head.orders, t.fj);
  clear_oscillator(head.orders, t.lc);
  if (p.sector_enabled[kFj]) {
    sincos(head.omega * lag, &t.fj.sin, &t.fj.cos);
    double basis = exp(-head.damping * t.x);
    for (int r = 0; r < head.orders; ++r) {
      if (r > 0) basis *= t.x / r;
      t.fj.basis[r] = basis;
    }
    t.sector[kFj] = evaluate_oscillator(head.orders, head.fj, t.fj);
  }
  if (p.sector_enabled[kAffine]) t.sector[kAffine] = -head.slope * t.rho;
  if (p.sector_enabled[kLc]) {
    sincos(head.omega * t.phi, &t.lc.sin, &t.lc.cos);
    double basis = 1.0;
    for (int r = 0; r < head.orders; ++r) {
      if (r > 0) basis *= beta;
      t.lc.basis[r] = basis;
    }
    t.sector[kLc] = evaluate_oscillator(head.orders, head.lc, t.lc);
  }
  t.bias = head.gate[kFj] * t.sector[kFj] + head.gate[kAffine] * t.sector[kAffine] + head.gate[kLc] * t.sector[kLc];
}

// Per-thread gradient partials of one head, indexed like the flattened head row of each slot.
struct Partials {
  double omega, damping, slope;
  double gate[3];
  OscillatorPartials fj, lc;
};

// Adds s · ∂(sector value)/∂(its parameters) to g and returns ∂(sector value)/∂θ · (−1), which
// the caller scales by ∂θ/∂ω (Δ for FJ, φ for LC).
__device__ double accumulate_oscillator(int orders, const Oscillator& sector, const OscillatorTerms& terms,
                                        double sector_value, double s, OscillatorPartials& g) {
  double phase_sum = 0.0;
  for (int r = 0; r < orders; ++r) {
    const double weight = sector.alpha[r] * terms.basis[r];
    g.re[r] += s * weight * terms.cos;
    g.im[r] -= s * weight * terms.sin;
    g.order[r] += s * sector.alpha[r] * (terms.basis[r] * terms.real[r] - sector_value);
    phase_sum += weight * (sector.re[r] * terms.sin + sector.im[r] * terms.cos);
  }
  return phase_sum;
}

__device__ void accumulate_lag(const PjBiasParams& p, const Head& head, const Lag& t, double G, Partials& g) {
  for (int k = 0; k < 3; ++k)
    if (p.sector_enabled[k]) g.gate[k] += G * head.gate[k] * (t.sector[k] - t.bias);
  if (p.sector_enabled[kFj]) {
    const double s = G * head.gate[kFj];
    g.damping -= s * t.x * t.sector[kFj] * head.damping_slope;
    g.omega -= s * t.lag * accumulate_oscillator(head.orders, head.fj, t.fj, t.sector[kFj], s, g.fj);
  }
  if (p.sector_enabled[kAffine]) g.slope -= G * head.gate[kAffine] * t.rho * head.slope_slope;
  if (p.sector_enabled[kLc]) {
    const double s = G * head.gate[kLc];
    g.omega -= s * t.phi * accumulate_oscillator(head.orders, head.lc, t.lc, t.sector[kLc], s, g.lc);
  }
}

__global__ void pj_bias_table_kernel(PjBiasParams p, int seq_len, float* table) {
  const int h = blockIdx.y;
  const int lag = blockIdx.x * blockDim.x + threadIdx.x;
  if (lag >= seq_len) return;
  const Head head = resolve_head(p, h);
  Lag t;
  evaluate_lag(p, head, lag, t);
  table[static_cast<long long>(h) * seq_len + lag] = static_cast<float>(t.bias);
}

// Block sum of `partial`, added by thread 0 to *out. All threads must call it.
__device__ void reduce_into(double partial, double* shared, float* out) {
  const double total = block_sum(partial, shared);
  if (threadIdx.x == 0) *out += static_cast<float>(total);
}

__global__ void pj_bias_backward_kernel(PjBiasParams p, int seq_len, const float* diag_grad, PjBiasGradients grads) {
  __shared__ double reduce_scratch[kWarpSize];
  const int h = blockIdx.x;
  const Head head = resolve_head(p, h);
  const int n = head.orders;
  Partials g = {};
  Lag t;
  for (int lag = threadIdx.x; lag < seq_len; lag += blockDim.x) {
    evaluate_lag(p, head, lag, t);
    accumulate_lag(p, head, t, diag_grad[static_cast<long long>(h) * seq_len + lag], g);
  }
  reduce_into(g.omega, reduce_scratch, grads.values[kPjSlotOmega] + h);
  reduce_into(g.damping, reduce_scratch, grads.values[kPjSlotFjDamping] + h);
  reduce_into(g.slope, reduce_scratch, grads.values[kPjSlotAffineSlope] + h);
  for (int k = 0; k < 3; ++k) reduce_into(g.gate[k], reduce_scratch, grads.values[kPjSlotGateLogits] + 3 * h + k);
  for (int r = 0; r < n; ++r) {
    reduce_into(g.fj.order[r], reduce_scratch, grads.values[kPjSlotFjOrderLogits] + n * h + r);
    reduce_into(g.fj.re[r], reduce_scratch, grads.values[kPjSlotFjRe] + n * h + r);
    reduce_into(g.fj.im[r], reduce_scratch, grads.values[kPjSlotFjIm] + n * h + r);
    reduce_into(g.lc.order[r], reduce_scratch, grads.values[kPjSlotLcOrderLogits] + n * h + r);
    reduce_into(g.lc.re[r], reduce_scratch, grads.values[kPjSlotLcRe] + n * h + r);
    reduce_into(g.lc.im[r], reduce_scratch, grads.values[kPjSlotLcIm] + n * h + r);
  }
}

bool valid(const PjBiasParams& p, int seq_len) {
  const bool any_sector = p.sector_enabled[0] || p.sector_enabled[1] || p.sector_enabled[2];
  return p.n_head > 0 && seq_len > 0 && p.train_length > 0 && p.order >= 0 && p.order <= kPjBiasMaxOrder &&
         any_sector;
}

}  // namespace

cudaError_t pj_bias_table(const PjBiasParams& params, int seq_len, float* table, cudaStream_t stream) {
  if (!valid(params, seq_len) || table == nullptr) return cudaErrorInvalidValue;
  const dim3 grid((seq_len + kTableThreads - 1) / kTableThreads, params.n_head);
  pj_bias_table_kernel<<<grid, kTableThreads, 0, stream>>>(params, seq_len, table);
  return cudaGetLastError();
}

cudaError_t pj_bias_backward(const PjBiasParams& params, int seq_len, const float* diag_grad,
                             const PjBiasGradients& gradients, cudaStream_t stream) {
  if (!valid(params, seq_len) || diag_grad == nullptr) return cudaErrorInvalidValue;
  for (float* g : gradients.values)
    if (g == nullptr) return cudaErrorInvalidValue;
  pj_bias_backward_kernel<<<params.n_head, kBackwardThreads, 0, stream>>>(params, seq_len, diag_grad, gradients);
  return cudaGetLastError();
}

}  // namespace pope::kernels
