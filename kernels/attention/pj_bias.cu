#include <type_traits>

#include "attention/pj_bias.cuh"
#include "block_reduce.cuh"

namespace pope::kernels {

namespace {

constexpr int kTableThreads = 256;
constexpr int kLagsPerBlock = 256;  // backward: one lag per thread, a block's partial sums per chunk
constexpr int kFj = 0, kAffine = 1, kLc = 2;

// Every per-order array has kOrders entries, a compile-time bound on the call's K + 1
// (with_order_bound), so that unrolled loops keep them in registers: sized by the runtime order
// (up to 16) they lived in local memory, a 3 KB stack frame per thread that made these kernels
// as slow as a fifth of the attention they serve. Entries past the call's orders hold zero
// weights and are neither evaluated into the bias nor written as gradients.

// softplus with the CPU's linear tail above 20, and its derivative.
__device__ double softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
__device__ double softplus_derivative(double x) { return x > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-x)); }

// The FJ and LC sectors have one form, Σ_r α_r basis_r(Δ) Re(ζ_r e^{iθ(Δ)}), and differ only in
// the basis (damped jet vs β^r) and the phase (ωΔ vs ωφ): the two structs below hold one such
// sector's parameters and its terms at one lag.
template <int kOrders>
struct Oscillator {
  double alpha[kOrders], re[kOrders], im[kOrders];  // order weights (softmax; 0 past the orders), ζ_r
};
template <int kOrders>
struct OscillatorTerms {
  double cos, sin;                         // of the phase θ
  double basis[kOrders], real[kOrders];    // basis_r, Re(ζ_r e^{iθ})
};

// One head's parameters after softmaxes and softplus (disabled sectors: gate exactly 0).
template <int kOrders>
struct Head {
  int orders;
  double omega, damping, damping_slope, slope, slope_slope;
  double gate[3];
  Oscillator<kOrders> fj, lc;
};

// A head's parameters pass through about fifteen double-precision exponentials (the softmaxes'
// numerators, softplus and its derivative twice): resolved by one thread, one after another, they
// held up every lag of the block. So a block resolves its head in two steps: each exponential on
// a thread of its own (head_exponential, the flat index below), then thread 0 adds and divides
// (the table kernel 14.4 → 11.5 µs at T = 10,240). The values are those of one thread doing it all
// (same operations, same order).
template <int kOrders>
struct HeadExponentials {
  // softplus(damping), its derivative, softplus(slope), its derivative, the gates' numerators,
  // then those of the FJ and the LC order weights (0 past the orders and for disabled sectors).
  static constexpr int kDamping = 0, kDampingSlope = 1, kSlope = 2, kSlopeSlope = 3, kGate = 4, kFj = 7,
                       kLc = 7 + kOrders, kCount = 7 + 2 * kOrders;
};

// exp(logits[i] − the largest kept logit) for a kept entry i < count, else 0: a softmax numerator.
__device__ double softmax_numerator(const float* logits, int count, const bool* keep, int i) {
  if (i >= count || (keep != nullptr && !keep[i])) return 0.0;
  double top = -1e300;
  for (int j = 0; j < count; ++j)
    if (keep == nullptr || keep[j]) top = fmax(top, double(logits[j]));
  return exp(double(logits[i]) - top);
}

template <int kOrders>
__device__ double head_exponential(const PjBiasParams& p, int h, int i) {
  using E = HeadExponentials<kOrders>;
  const int n = p.order + 1;
  switch (i) {
    case E::kDamping:
      return softplus(p.values[kPjSlotFjDamping][h]);
    case E::kDampingSlope:
      return softplus_derivative(p.values[kPjSlotFjDamping][h]);
    case E::kSlope:
      return softplus(p.values[kPjSlotAffineSlope][h]);
    case E::kSlopeSlope:
      return softplus_derivative(p.values[kPjSlotAffineSlope][h]);
    default:
      break;
  }
  if (i < E::kFj) return softmax_numerator(p.values[kPjSlotGateLogits] + 3 * h, 3, p.sector_enabled, i - E::kGate);
  if (i < E::kLc) return softmax_numerator(p.values[kPjSlotFjOrderLogits] + n * h, n, nullptr, i - E::kFj);
  return softmax_numerator(p.values[kPjSlotLcOrderLogits] + n * h, n, nullptr, i - E::kLc);
}

// out[i] = numerators[i] / Σ numerators (summed in index order).
template <int kCount>
__device__ void normalise(const double* numerators, double (&out)[kCount]) {
  double total = 0.0;
#pragma unroll
  for (int i = 0; i < kCount; ++i) total += numerators[i];
#pragma unroll
  for (int i = 0; i < kCount; ++i) out[i] = numerators[i] / total;
}

template <int kOrders>
__device__ Head<kOrders> assemble_head(const PjBiasParams& p, int h, const double* exponentials) {
  using E = HeadExponentials<kOrders>;
  Head<kOrders> head;
  const int n = p.order + 1;
  head.orders = n;
  head.omega = p.values[kPjSlotOmega][h];
  head.damping = exponentials[E::kDamping];
  head.damping_slope = exponentials[E::kDampingSlope];
  head.slope = exponentials[E::kSlope];
  head.slope_slope = exponentials[E::kSlopeSlope];
  normalise(exponentials + E::kGate, head.gate);
  normalise(exponentials + E::kFj, head.fj.alpha);
  normalise(exponentials + E::kLc, head.lc.alpha);
#pragma unroll
  for (int r = 0; r < kOrders; ++r) {
    const bool used = r < n;
    head.fj.re[r] = used ? p.values[kPjSlotFjRe][n * h + r] : 0.0;
    head.fj.im[r] = used ? p.values[kPjSlotFjIm][n * h + r] : 0.0;
    head.lc.re[r] = used ? p.values[kPjSlotLcRe][n * h + r] : 0.0;
    head.lc.im[r] = used ? p.values[kPjSlotLcIm][n * h + r] : 0.0;
  }
  return head;
}

// Head h's parameters resolved once per block (see HeadExponentials) and shared. All threads of
// the block call it.
template <int kOrders>
__device__ const Head<kOrders>& block_head(const PjBiasParams& p, int h) {
  using E = HeadExponentials<kOrders>;
  __shared__ Head<kOrders> head;
  __shared__ double exponentials[E::kCount];
  for (int i = int(threadIdx.x); i < E::kCount; i += int(blockDim.x)) exponentials[i] = head_exponential<kOrders>(p, h, i);
  __syncthreads();
  if (threadIdx.x == 0) head = assemble_head<kOrders>(p, h, exponentials);
  __syncthreads();
  return head;
}

// Every term of b_h at one lag (as PjLag on the CPU).
template <int kOrders>
struct Lag {
  double lag, x, rho, phi;
  OscillatorTerms<kOrders> fj, lc;
  double sector[3];
  double bias;
};

// Sets terms.real from the phase and returns the sector's value Σ_r α_r basis_r real_r (the
// basis already set by the caller).
template <int kOrders>
__device__ double evaluate_oscillator(const Oscillator<kOrders>& sector, OscillatorTerms<kOrders>& terms) {
  double value = 0.0;
#pragma unroll
  for (int r = 0; r < kOrders; ++r) {
    terms.real[r] = sector.re[r] * terms.cos - sector.im[r] * terms.sin;
    value += sector.alpha[r] * terms.basis[r] * terms.real[r];
  }
  return value;
}

template <int kOrders>
__device__ void clear_oscillator(OscillatorTerms<kOrders>& terms) {
  terms.cos = 1.0, terms.sin = 0.0;
#pragma unroll
  for (int r = 0; r < kOrders; ++r) terms.basis[r] = terms.real[r] = 0.0;
}

template <int kOrders>
__device__ void evaluate_lag(const PjBiasParams& p, const Head<kOrders>& head, int lag, Lag<kOrders>& t) {
  const double L = p.train_length;
  t.lag = lag;
  t.x = lag / L;
  const double asinh_x = asinh(t.x);
  t.rho = p.lightcone_rho ? asinh_x : t.x;
  t.phi = L * asinh_x;
  const double beta = lag / sqrt(double(lag) * lag + L * L);
  t.sector[kFj] = t.sector[kAffine] = t.sector[kLc] = 0.0;
  clear_oscillator(t.fj);
  clear_oscillator(t.lc);
  if (p.sector_enabled[kFj]) {
    sincos(head.omega * lag, &t.fj.sin, &t.fj.cos);
    double basis = exp(-head.damping * t.x);
#pragma unroll
    for (int r = 0; r < kOrders; ++r) {
      if (r > 0) basis *= t.x / r;
      t.fj.basis[r] = r < head.orders ? basis : 0.0;  // past the orders x^r/r! could overflow
    }
    t.sector[kFj] = evaluate_oscillator(head.fj, t.fj);
  }
  if (p.sector_enabled[kAffine]) t.sector[kAffine] = -head.slope * t.rho;
  if (p.sector_enabled[kLc]) {
    sincos(head.omega * t.phi, &t.lc.sin, &t.lc.cos);
    double basis = 1.0;
#pragma unroll
    for (int r = 0; r < kOrders; ++r) {
      if (r > 0) basis *= beta;
      t.lc.basis[r] = basis;
    }
    t.sector[kLc] = evaluate_oscillator(head.lc, t.lc);
  }
  t.bias = head.gate[kFj] * t.sector[kFj] + head.gate[kAffine] * t.sector[kAffine] + head.gate[kLc] * t.sector[kLc];
}

// One head's gradient partials, flat so that a block reduces them in one pass: ω, the FJ damping
// and the affine slope, the three gate logits, then per sector (FJ, LC) the order logits, Re ζ
// and Im ζ, kOrders each.
constexpr int partial_count(int orders) { return 6 + 6 * orders; }
template <int kOrders>
struct Partials {
  static constexpr int kOmega = 0, kDamping = 1, kSlope = 2, kGate = 3, kFjBase = 6, kLcBase = 6 + 3 * kOrders;
  static constexpr int kCount = partial_count(kOrders);
  // Offsets inside a sector's block.
  static constexpr int kOrder = 0, kRe = kOrders, kIm = 2 * kOrders;
  double value[kCount];
};

// Adds s · ∂(sector value)/∂(its parameters) to the sector's block g of Partials and returns
// ∂(sector value)/∂θ · (−1), which the caller scales by ∂θ/∂ω (Δ for FJ, φ for LC).
template <int kOrders>
__device__ double accumulate_oscillator(const Oscillator<kOrders>& sector, const OscillatorTerms<kOrders>& terms,
                                        double sector_value, double s, double* g) {
  using P = Partials<kOrders>;
  double phase_sum = 0.0;
#pragma unroll
  for (int r = 0; r < kOrders; ++r) {
    const double weight = sector.alpha[r] * terms.basis[r];
    g[P::kRe + r] += s * weight * terms.cos;
    g[P::kIm + r] -= s * weight * terms.sin;
    g[P::kOrder + r] += s * sector.alpha[r] * (terms.basis[r] * terms.real[r] - sector_value);
    phase_sum += weight * (sector.re[r] * terms.sin + sector.im[r] * terms.cos);
  }
  return phase_sum;
}

template <int kOrders>
__device__ void accumulate_lag(const PjBiasParams& p, const Head<kOrders>& head, const Lag<kOrders>& t, double G,
                               Partials<kOrders>& g) {
  using P = Partials<kOrders>;
#pragma unroll
  for (int k = 0; k < 3; ++k)
    if (p.sector_enabled[k]) g.value[P::kGate + k] += G * head.gate[k] * (t.sector[k] - t.bias);
  if (p.sector_enabled[kFj]) {
    const double s = G * head.gate[kFj];
    g.value[P::kDamping] -= s * t.x * t.sector[kFj] * head.damping_slope;
    g.value[P::kOmega] -= s * t.lag * accumulate_oscillator(head.fj, t.fj, t.sector[kFj], s, g.value + P::kFjBase);
  }
  if (p.sector_enabled[kAffine]) g.value[P::kSlope] -= G * head.gate[kAffine] * t.rho * head.slope_slope;
  if (p.sector_enabled[kLc]) {
    const double s = G * head.gate[kLc];
    g.value[P::kOmega] -= s * t.phi * accumulate_oscillator(head.lc, t.lc, t.sector[kLc], s, g.value + P::kLcBase);
  }
}

// The gradient buffer and element that flat partial i of head h adds into, or null for the
// orders past the call's.
template <int kOrders>
__device__ float* gradient_of(const PjBiasGradients& grads, int orders, int h, int i) {
  using P = Partials<kOrders>;
  if (i == P::kOmega) return grads.values[kPjSlotOmega] + h;
  if (i == P::kDamping) return grads.values[kPjSlotFjDamping] + h;
  if (i == P::kSlope) return grads.values[kPjSlotAffineSlope] + h;
  if (i < P::kFjBase) return grads.values[kPjSlotGateLogits] + 3 * h + (i - P::kGate);
  const bool fj = i < P::kLcBase;
  const int within = i - (fj ? P::kFjBase : P::kLcBase), part = within / kOrders, r = within % kOrders;
  if (r >= orders) return nullptr;
  const PjBiasSlot slots[2][3] = {{kPjSlotFjOrderLogits, kPjSlotFjRe, kPjSlotFjIm},
                                  {kPjSlotLcOrderLogits, kPjSlotLcRe, kPjSlotLcIm}};
  return grads.values[slots[fj ? 0 : 1][part]] + orders * h + r;
}

template <int kOrders>
__global__ void __launch_bounds__(kTableThreads) pj_bias_table_kernel(PjBiasParams p, int seq_len, float* table) {
  const int h = blockIdx.y;
  const int lag = blockIdx.x * blockDim.x + threadIdx.x;
  const Head<kOrders>& head = block_head<kOrders>(p, h);
  if (lag >= seq_len) return;
  Lag<kOrders> t;
  evaluate_lag(p, head, lag, t);
  table[static_cast<long long>(h) * seq_len + lag] = static_cast<float>(t.bias);
}

// Block = (chunk of kLagsPerBlock lags, head), one lag per thread: the block's sums of every
// partial in a fixed shape (a butterfly per warp, then the warps in order) into
// partials[(h · chunks + chunk) · kCount + i].
template <int kOrders>
__global__ void __launch_bounds__(kLagsPerBlock)
    pj_bias_partial_kernel(PjBiasParams p, int seq_len, const float* diag_grad, double* partials) {
  using P = Partials<kOrders>;
  constexpr int kWarps = kLagsPerBlock / kWarpSize;
  __shared__ double warp_sums[kWarps][P::kCount];
  const int h = blockIdx.y, lag = blockIdx.x * kLagsPerBlock + threadIdx.x;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  P g = {};
  const Head<kOrders>& head = block_head<kOrders>(p, h);
  if (lag < seq_len) {
    Lag<kOrders> t;
    evaluate_lag(p, head, lag, t);
    accumulate_lag(p, head, t, diag_grad[static_cast<long long>(h) * seq_len + lag], g);
  }
#pragma unroll
  for (int i = 0; i < P::kCount; ++i) {
    const double total = warp_reduce(g.value[i], SumOp{});
    if (lane == 0) warp_sums[warp][i] = total;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < P::kCount; i += kLagsPerBlock) {
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w][i];
    partials[(static_cast<long long>(h) * gridDim.x + blockIdx.x) * P::kCount + i] = total;
  }
}

// Block = head, thread = flat partial: its chunks' sums added in order onto the gradient.
template <int kOrders>
__global__ void pj_bias_gradient_kernel(int orders, int chunks, const double* partials, PjBiasGradients grads) {
  using P = Partials<kOrders>;
  const int h = blockIdx.x, i = threadIdx.x;
  if (i >= P::kCount) return;
  float* out = gradient_of<kOrders>(grads, orders, h, i);
  if (out == nullptr) return;
  double total = 0.0;
  for (int c = 0; c < chunks; ++c) total += partials[(static_cast<long long>(h) * chunks + c) * P::kCount + i];
  *out += static_cast<float>(total);
}

bool valid(const PjBiasParams& p, int seq_len) {
  const bool any_sector = p.sector_enabled[0] || p.sector_enabled[1] || p.sector_enabled[2];
  return p.n_head > 0 && seq_len > 0 && p.train_length > 0 && p.order >= 0 && p.order <= kPjBiasMaxOrder &&
         any_sector;
}

// The kernels' compile-time order bound for a call: the smallest of 4, 8, 16 holding its K + 1
// orders (4: the default K = 3 and below).
int order_bound(const PjBiasParams& p) {
  static_assert(kPjBiasMaxOrder + 1 <= 16, "the largest order bound must hold every order");
  const int orders = p.order + 1;
  return orders <= 4 ? 4 : orders <= 8 ? 8 : 16;
}

// body(std::integral_constant<int, order_bound(p)>).
template <class Body>
cudaError_t with_order_bound(const PjBiasParams& p, Body&& body) {
  switch (order_bound(p)) {
    case 4:
      return body(std::integral_constant<int, 4>{});
    case 8:
      return body(std::integral_constant<int, 8>{});
    default:
      return body(std::integral_constant<int, 16>{});
  }
}

int chunks_of(int seq_len) { return (seq_len + kLagsPerBlock - 1) / kLagsPerBlock; }

}  // namespace

cudaError_t pj_bias_table(const PjBiasParams& params, int seq_len, float* table, cudaStream_t stream) {
  if (!valid(params, seq_len) || table == nullptr) return cudaErrorInvalidValue;
  const dim3 grid((seq_len + kTableThreads - 1) / kTableThreads, params.n_head);
  return with_order_bound(params, [&](auto bound) {
    pj_bias_table_kernel<decltype(bound)::value><<<grid, kTableThreads, 0, stream>>>(params, seq_len, table);
    return cudaGetLastError();
  });
}

std::size_t pj_bias_backward_partial_doubles(const PjBiasParams& params, int seq_len) {
  if (!valid(params, seq_len)) return 0;
  return std::size_t(params.n_head) * std::size_t(chunks_of(seq_len)) * std::size_t(partial_count(order_bound(params)));
}

cudaError_t pj_bias_backward(const PjBiasParams& params, int seq_len, const float* diag_grad,
                             const PjBiasGradients& gradients, double* partials, cudaStream_t stream) {
  if (!valid(params, seq_len) || diag_grad == nullptr || partials == nullptr) return cudaErrorInvalidValue;
  for (float* g : gradients.values)
    if (g == nullptr) return cudaErrorInvalidValue;
  const int chunks = chunks_of(seq_len);
  return with_order_bound(params, [&](auto bound) {
    constexpr int kOrders = decltype(bound)::value;
    pj_bias_partial_kernel<kOrders>
        <<<dim3(chunks, params.n_head), kLagsPerBlock, 0, stream>>>(params, seq_len, diag_grad, partials);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    pj_bias_gradient_kernel<kOrders><<<params.n_head, Partials<kOrders>::kCount, 0, stream>>>(
        params.order + 1, chunks, partials, gradients);
    return cudaGetLastError();
  });
}

}  // namespace pope::kernels
