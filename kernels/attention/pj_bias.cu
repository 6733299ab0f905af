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

// One head's parameters after softmaxes and softplus (disabled sectors: gate exactly 0).
struct Head {
  int orders;
  double omega, damping, damping_slope, slope, slope_slope;
  double gate[3];
  double fj_alpha[kMaxOrders], fj_re[kMaxOrders], fj_im[kMaxOrders];
  double lc_alpha[kMaxOrders], lc_re[kMaxOrders], lc_im[kMaxOrders];
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
  softmax(p.values[kPjSlotFjOrderLogits] + n * h, n, nullptr, head.fj_alpha);
  softmax(p.values[kPjSlotLcOrderLogits] + n * h, n, nullptr, head.lc_alpha);
  for (int r = 0; r < n; ++r) {
    head.fj_re[r] = p.values[kPjSlotFjRe][n * h + r];
    head.fj_im[r] = p.values[kPjSlotFjIm][n * h + r];
    head.lc_re[r] = p.values[kPjSlotLcRe][n * h + r];
    head.lc_im[r] = p.values[kPjSlotLcIm][n * h + r];
  }
  return head;
}

// Every term of b_h at one lag (as PjLag on the CPU).
struct Lag {
  double lag, x, rho, phi;
  double fj_cos, fj_sin, lc_cos, lc_sin;
  double fj_basis[kMaxOrders], fj_real[kMaxOrders], lc_basis[kMaxOrders], lc_real[kMaxOrders];
  double sector[3];
  double bias;
};

__device__ void evaluate_lag(const PjBiasParams& p, const Head& head, int lag, Lag& t) {
  const double L = p.train_length;
  t.lag = lag;
  t.x = lag / L;
  t.rho = p.lightcone_rho ? asinh(t.x) : t.x;
  t.phi = L * asinh(t.x);
  const double beta = lag / sqrt(double(lag) * lag + L * L);
  t.sector[kFj] = t.sector[kAffine] = t.sector[kLc] = 0.0;
  t.fj_cos = 1.0, t.fj_sin = 0.0, t.lc_cos = 1.0, t.lc_sin = 0.0;
  for (int r = 0; r < head.orders; ++r) t.fj_basis[r] = t.fj_real[r] = t.lc_basis[r] = t.lc_real[r] = 0.0;
  if (p.sector_enabled[kFj]) {
    sincos(head.omega * lag, &t.fj_sin, &t.fj_cos);
    double basis = exp(-head.damping * t.x);
    for (int r = 0; r < head.orders; ++r) {
      if (r > 0) basis *= t.x / r;
      t.fj_basis[r] = basis;
      t.fj_real[r] = head.fj_re[r] * t.fj_cos - head.fj_im[r] * t.fj_sin;
      t.sector[kFj] += head.fj_alpha[r] * basis * t.fj_real[r];
    }
  }
  if (p.sector_enabled[kAffine]) t.sector[kAffine] = -head.slope * t.rho;
  if (p.sector_enabled[kLc]) {
    sincos(head.omega * t.phi, &t.lc_sin, &t.lc_cos);
    double basis = 1.0;
    for (int r = 0; r < head.orders; ++r) {
      if (r > 0) basis *= beta;
      t.lc_basis[r] = basis;
      t.lc_real[r] = head.lc_re[r] * t.lc_cos - head.lc_im[r] * t.lc_sin;
      t.sector[kLc] += head.lc_alpha[r] * basis * t.lc_real[r];
    }
  }
  t.bias = head.gate[kFj] * t.sector[kFj] + head.gate[kAffine] * t.sector[kAffine] + head.gate[kLc] * t.sector[kLc];
}

// Per-thread gradient partials of one head, indexed like the flattened head row of each slot.
struct Partials {
  double omega, damping, slope;
  double gate[3];
  double fj_order[kMaxOrders], fj_re[kMaxOrders], fj_im[kMaxOrders];
  double lc_order[kMaxOrders], lc_re[kMaxOrders], lc_im[kMaxOrders];
};

__device__ void accumulate_lag(const PjBiasParams& p, const Head& head, const Lag& t, double G, Partials& g) {
  for (int k = 0; k < 3; ++k)
    if (p.sector_enabled[k]) g.gate[k] += G * head.gate[k] * (t.sector[k] - t.bias);
  if (p.sector_enabled[kFj]) {
    const double s = G * head.gate[kFj];
    double omega_sum = 0.0;
    for (int r = 0; r < head.orders; ++r) {
      const double weight = head.fj_alpha[r] * t.fj_basis[r];
      g.fj_re[r] += s * weight * t.fj_cos;
      g.fj_im[r] -= s * weight * t.fj_sin;
      g.fj_order[r] += s * head.fj_alpha[r] * (t.fj_basis[r] * t.fj_real[r] - t.sector[kFj]);
      omega_sum += weight * (head.fj_re[r] * t.fj_sin + head.fj_im[r] * t.fj_cos);
    }
    g.damping -= s * t.x * t.sector[kFj] * head.damping_slope;
    g.omega -= s * t.lag * omega_sum;
  }
  if (p.sector_enabled[kAffine]) g.slope -= G * head.gate[kAffine] * t.rho * head.slope_slope;
  if (p.sector_enabled[kLc]) {
    const double s = G * head.gate[kLc];
    double omega_sum = 0.0;
    for (int r = 0; r < head.orders; ++r) {
      const double weight = head.lc_alpha[r] * t.lc_basis[r];
      g.lc_re[r] += s * weight * t.lc_cos;
      g.lc_im[r] -= s * weight * t.lc_sin;
      g.lc_order[r] += s * head.lc_alpha[r] * (t.lc_basis[r] * t.lc_real[r] - t.sector[kLc]);
      omega_sum += weight * (head.lc_re[r] * t.lc_sin + head.lc_im[r] * t.lc_cos);
    }
    g.omega -= s * t.phi * omega_sum;
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
    reduce_into(g.fj_order[r], reduce_scratch, grads.values[kPjSlotFjOrderLogits] + n * h + r);
    reduce_into(g.fj_re[r], reduce_scratch, grads.values[kPjSlotFjRe] + n * h + r);
    reduce_into(g.fj_im[r], reduce_scratch, grads.values[kPjSlotFjIm] + n * h + r);
    reduce_into(g.lc_order[r], reduce_scratch, grads.values[kPjSlotLcOrderLogits] + n * h + r);
    reduce_into(g.lc_re[r], reduce_scratch, grads.values[kPjSlotLcRe] + n * h + r);
    reduce_into(g.lc_im[r], reduce_scratch, grads.values[kPjSlotLcIm] + n * h + r);
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
