// Causal multi-head attention with a pluggable positional encoding, the reference for the
// CUDA flash-attention kernel. For each (batch b, head h):
//   q̃, k̃ = the encoding's transform of the head's q and k rows (or q, k themselves)
//   a_ts  = <q̃_t, k̃_s> · scale + bias_h[t − s]      for s ≤ t (causal)
//   P     = softmax over s of a_ts;  out_t = Σ_s P_ts v_s;  lse_t = log Σ_s exp(a_ts)
// Rows are processed one at a time (O(T) scratch per query, never a T×T matrix) so long
// contexts fit. The backward recomputes P from lse, flash-attention style:
//   D_t = <dout_t, out_t>,  dP_ts = <dout_t, v_s>,  dS_ts = P_ts (dP_ts − D_t)
//   dq̃_t += scale · dS_ts k̃_s,  dk̃_s += scale · dS_ts q̃_t,  dv_s += P_ts dout_t
//   diag_h[t − s] += dS_ts (summed over the batch) → the bias's parameter gradient.
// Work is parallel over heads (batch loop inside): an encoding's parameters and gradients
// have head as their leading dimension, so each thread owns its heads' rows outright and
// the result does not depend on the thread count.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"
#include "cpu/cpu_position_params.hpp"
#include "model/attention_checks.hpp"

namespace pope::cpu {

namespace {

// Sizes of one attention call, validated against the tensors and the encoding.
struct Geometry {
  int batch, seq_len, n_head, head_dim;
  int qk_width;              // width of q̃, k̃ (the encoding may change it)
  std::int64_t channels;     // C = n_head · head_dim
  std::int64_t qkv_stride;   // 3C, row stride of qkv and dqkv
  bool transforms, has_bias;
  double scale;

  // Offset of head h's q, k or v columns (block 0, 1, 2) in row n of qkv.
  std::int64_t qkv_offset(std::int64_t row, int block, int head) const {
    return row * qkv_stride + block * channels + std::int64_t(head) * head_dim;
  }
  std::int64_t out_offset(std::int64_t row, int head) const { return row * channels + std::int64_t(head) * head_dim; }
};

constexpr int kQuery = 0, kKey = 1, kValue = 2;

Geometry check_geometry(std::string_view op, AttentionImpl impl, const AttentionShape& shape,
                        const PositionEncoding* encoding, const PositionContext& ctx, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, DType real) {
  require(impl == AttentionImpl::fused, op,
          fmt::format("attention.impl is {}; the CPU backend has only its reference attention (expected fused)",
                      name_of(impl)));
  checks::check_attention_call(op, shape, encoding, ctx);
  Geometry g{};
  g.batch = shape.batch;
  g.seq_len = shape.seq_len;
  g.n_head = shape.n_head;
  g.head_dim = shape.head_dim;
  g.transforms = encoding->transforms_qk();
  g.has_bias = encoding->has_score_bias();
  g.qk_width = g.transforms ? encoding->qk_width(shape.head_dim) : shape.head_dim;
  require(g.qk_width > 0, op, fmt::format("encoding '{}' reports qk_width {}, expected > 0", encoding->kind(), g.qk_width));
  g.channels = std::int64_t(shape.n_head) * shape.head_dim;
  g.qkv_stride = 3 * g.channels;
  g.scale = encoding->softmax_scale(ctx);
  const std::int64_t rows = std::int64_t(shape.batch) * shape.seq_len;
  check_matrix(op, "qkv", qkv, real, rows, g.qkv_stride);
  check_matrix(op, "out", out, real, rows, g.channels);
  check_vector(op, "lse", lse, real, std::int64_t(shape.batch) * shape.n_head * shape.seq_len);
  return g;
}

template <class Pointer>
std::vector<Pointer> parameter_pointers(std::string_view op, std::string_view name, std::span<const Tensor> tensors,
                                        const PositionEncoding& encoding, const Geometry& g) {
  return position_parameter_pointers<Pointer>(op, name, tensors, encoding, g.n_head, g.head_dim);
}

// Rows of a [T, width] matrix stored with a row stride (the qkv columns of one head, or a
// contiguous scratch buffer).
template <class Real> struct StridedRows {
  Real* data;
  std::int64_t stride;
  Real* row(std::int64_t t) const { return data + t * stride; }
};

template <class Real> Real dot(const Real* a, const Real* b, int n) {
  Real sum = 0;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Per-thread scratch of one head: transformed q̃/k̃ and their gradients, the bias table and
// one row of scores. Everything is O(T · qk_width).
template <class Real> struct HeadScratch {
  std::vector<Real> q, k, dq, dk, bias, scores, diag;
  explicit HeadScratch(const Geometry& g, bool backward) {
    const std::size_t rows = std::size_t(g.seq_len), width = std::size_t(g.qk_width);
    if (g.transforms) {
      q.resize(rows * width);
      k.resize(rows * width);
      if (backward) {
        dq.resize(rows * width);
        dk.resize(rows * width);
      }
    }
    bias.assign(rows, Real(0));  // stays zero without a bias
    scores.resize(rows);
    if (backward) diag.assign(rows, Real(0));
  }
};

// Head h's queries or keys of batch b as the scores see them: the encoding's transform
// into `buffer` when it has one, else the qkv columns themselves.
template <class Real>
StridedRows<const Real> scored_rows(const Geometry& g, const PositionEncoding& encoding, const PositionContext& ctx,
                                    ParamValues<Real> params, const Real* qkv, int b, int h, int block,
                                    std::vector<Real>& buffer) {
  const Real* x = qkv + g.qkv_offset(std::int64_t(b) * g.seq_len, block, h);
  if (!g.transforms) return {x, g.qkv_stride};
  QkTransformArgs<Real> args;
  args.ctx = &ctx;
  args.head = h;
  args.is_key = block == kKey;
  args.x = x;
  args.x_stride = g.qkv_stride;
  args.y = buffer.data();
  args.params = params;
  encoding.transform_qk(args);
  return {buffer.data(), g.qk_width};
}

// scores[s] = <q̃_t, k̃_s> · scale + bias[t − s] for s = 0..t; returns the row maximum.
template <class Real>
Real causal_scores(const Geometry& g, StridedRows<const Real> q, StridedRows<const Real> k, int t,
                   const std::vector<Real>& bias, std::vector<Real>& scores) {
  const Real scale = Real(g.scale);
  const Real* query = q.row(t);
  Real max_score = -INFINITY;
  for (int s = 0; s <= t; ++s) {
    scores[s] = dot(query, k.row(s), g.qk_width) * scale + bias[t - s];
    max_score = std::max(max_score, scores[s]);
  }
  return max_score;
}

template <class Real>
void fill_bias_table(const Geometry& g, const PositionEncoding& encoding, const PositionContext& ctx, int h,
                     ParamValues<Real> params, std::vector<Real>& table) {
  if (g.has_bias) encoding.score_bias(ctx, h, params, table.data());
}

}  // namespace

template <class Real> void attention_forward(int threads, const AttentionForward& args) {
  constexpr std::string_view op = "attention_forward";
  const Geometry g = check_geometry(op, args.impl, args.shape, args.encoding, args.position, args.qkv, args.out,
                                    args.lse, dtype_of<Real>());
  const PositionEncoding& encoding = *args.encoding;
  const auto param_ptrs =
      parameter_pointers<const Real*>(op, "position_params", args.position_params, encoding, g);
  const ParamValues<Real> params(param_ptrs);
  const Real* qkv = args.qkv.as<Real>();
  Real* out = args.out.as<Real>();
  Real* lse = args.lse.as<Real>();
  const int T = g.seq_len, d = g.head_dim;

  parallel_for(threads, g.n_head, [&](std::int64_t head) {
    const int h = int(head);
    HeadScratch<Real> scratch(g, /*backward=*/false);
    fill_bias_table(g, encoding, args.position, h, params, scratch.bias);
    for (int b = 0; b < g.batch; ++b) {
      const auto q = scored_rows(g, encoding, args.position, params, qkv, b, h, kQuery, scratch.q);
      const auto k = scored_rows(g, encoding, args.position, params, qkv, b, h, kKey, scratch.k);
      const StridedRows<const Real> v{qkv + g.qkv_offset(std::int64_t(b) * T, kValue, h), g.qkv_stride};
      for (int t = 0; t < T; ++t) {
        const Real max_score = causal_scores(g, q, k, t, scratch.bias, scratch.scores);
        Real sum = 0;
        for (int s = 0; s <= t; ++s) sum += (scratch.scores[s] = std::exp(scratch.scores[s] - max_score));
        Real* y = out + g.out_offset(std::int64_t(b) * T + t, h);
        std::fill(y, y + d, Real(0));
        for (int s = 0; s <= t; ++s) {
          const Real weight = scratch.scores[s] / sum;
          const Real* value = v.row(s);
          for (int i = 0; i < d; ++i) y[i] += weight * value[i];
        }
        lse[(std::int64_t(b) * g.n_head + h) * T + t] = max_score + std::log(sum);
      }
    }
  });
}

template <class Real> void attention_backward(int threads, const AttentionBackward& args) {
  constexpr std::string_view op = "attention_backward";
  constexpr DType real = dtype_of<Real>();
  const Geometry g =
      check_geometry(op, args.impl, args.shape, args.encoding, args.position, args.qkv, args.out, args.lse, real);
  const std::int64_t rows = std::int64_t(g.batch) * g.seq_len;
  check_matrix(op, "dout", args.dout, real, rows, g.channels);
  check_matrix(op, "dqkv", args.dqkv, real, rows, g.qkv_stride);
  const PositionEncoding& encoding = *args.encoding;
  const auto param_ptrs = parameter_pointers<const Real*>(op, "position_params", args.position_params, encoding, g);
  const auto grad_ptrs = parameter_pointers<Real*>(op, "position_grads", args.position_grads, encoding, g);
  const ParamValues<Real> params(param_ptrs);
  const ParamGrads<Real> dparams(grad_ptrs);
  const Real *qkv = args.qkv.as<Real>(), *out = args.out.as<Real>(), *lse = args.lse.as<Real>();
  const Real* dout = args.dout.as<Real>();
  Real* dqkv = args.dqkv.as<Real>();
  const int T = g.seq_len, d = g.head_dim, w = g.qk_width;
  const Real scale = Real(g.scale);

  // dqkv is overwritten; the passes below (and the transform backward) accumulate into it.
  parallel_for(threads, rows * g.qkv_stride, [&](std::int64_t i) { dqkv[i] = Real(0); });

  parallel_for(threads, g.n_head, [&](std::int64_t head) {
    const int h = int(head);
    HeadScratch<Real> scratch(g, /*backward=*/true);
    fill_bias_table(g, encoding, args.position, h, params, scratch.bias);
    for (int b = 0; b < g.batch; ++b) {
      const std::int64_t first_row = std::int64_t(b) * T;
      const auto q = scored_rows(g, encoding, args.position, params, qkv, b, h, kQuery, scratch.q);
      const auto k = scored_rows(g, encoding, args.position, params, qkv, b, h, kKey, scratch.k);
      const StridedRows<const Real> v{qkv + g.qkv_offset(first_row, kValue, h), g.qkv_stride};
      // Gradients of q̃ and k̃ go to scratch when a transform must map them back to q and k,
      // else straight into dqkv.
      if (g.transforms) {
        std::fill(scratch.dq.begin(), scratch.dq.end(), Real(0));
        std::fill(scratch.dk.begin(), scratch.dk.end(), Real(0));
      }
      const StridedRows<Real> dq = g.transforms ? StridedRows<Real>{scratch.dq.data(), w}
                                                : StridedRows<Real>{dqkv + g.qkv_offset(first_row, kQuery, h), g.qkv_stride};
      const StridedRows<Real> dk = g.transforms ? StridedRows<Real>{scratch.dk.data(), w}
                                                : StridedRows<Real>{dqkv + g.qkv_offset(first_row, kKey, h), g.qkv_stride};
      const StridedRows<Real> dv{dqkv + g.qkv_offset(first_row, kValue, h), g.qkv_stride};

      for (int t = 0; t < T; ++t) {
        causal_scores(g, q, k, t, scratch.bias, scratch.scores);
        const Real row_lse = lse[(std::int64_t(b) * g.n_head + h) * T + t];
        const Real* dy = dout + g.out_offset(first_row + t, h);
        const Real D = dot(dy, out + g.out_offset(first_row + t, h), d);
        for (int s = 0; s <= t; ++s) {
          const Real p = std::exp(scratch.scores[s] - row_lse);
          const Real dS = p * (dot(dy, v.row(s), d) - D);
          const Real *qt = q.row(t), *ks = k.row(s);
          Real *dqt = dq.row(t), *dks = dk.row(s), *dvs = dv.row(s);
          for (int i = 0; i < w; ++i) {
            dqt[i] += scale * dS * ks[i];
            dks[i] += scale * dS * qt[i];
          }
          for (int i = 0; i < d; ++i) dvs[i] += p * dy[i];
          scratch.diag[t - s] += dS;
        }
      }

      if (g.transforms) {
        for (int block : {kQuery, kKey}) {
          QkTransformBackwardArgs<Real> back;
          back.ctx = &args.position;
          back.head = h;
          back.is_key = block == kKey;
          back.x = qkv + g.qkv_offset(first_row, block, h);
          back.x_stride = g.qkv_stride;
          back.dy = block == kKey ? scratch.dk.data() : scratch.dq.data();
          back.dx = dqkv + g.qkv_offset(first_row, block, h);
          back.dx_stride = g.qkv_stride;
          back.params = params;
          back.dparams = dparams;
          encoding.transform_qk_backward(back);
        }
      }
    }
    if (g.has_bias) encoding.score_bias_backward(args.position, h, params, scratch.diag.data(), dparams);
  });
}

template void attention_forward<float>(int, const AttentionForward&);
template void attention_forward<double>(int, const AttentionForward&);
template void attention_backward<float>(int, const AttentionBackward&);
template void attention_backward<double>(int, const AttentionBackward&);

}  // namespace pope::cpu
