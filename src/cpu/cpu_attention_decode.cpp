// Incremental decoding's attention on the CPU (Backend::attention_decode), the reference for the
// CUDA decode path. For each (sequence b, head h), with p0 rows already cached and n new ones:
//   k̃, v of the new rows → cache rows [p0, p0 + n) (every row again where the transform changes
//   with the length: dynamic NTK encodes the kept raw keys at the new length)
//   a_ts  = <q̃_t, k̃_s> · scale + bias_h[t − s]      for s ≤ t, t = p0 … p0 + n − 1
//   out_t = Σ_s softmax_s(a_ts) v_s
// with the scale and bias table of a call over positions [0, p0 + n), so that each new row gets
// what a full forward over the same tokens gives its last rows (cpu_attention.cpp's arithmetic,
// in the same order). Parallel over heads like the full forward.
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

void check_cache_tensor(std::string_view op, std::string_view name, const Tensor& t, DType dtype, int B, int H,
                        int width) {
  check_floating(op, name, t);
  require(t.dtype == dtype && t.shape.size() == 4 && t.shape[0] == B && t.shape[1] == H && t.shape[3] == width, op,
          fmt::format("{} is {} {}, expected {} [{}, {}, capacity, {}]", name, dtype_name(t.dtype),
                      shape_string(t.shape), dtype_name(dtype), B, H, width));
}

}  // namespace

template <class Real> void attention_decode(int threads, const AttentionDecode& args) {
  constexpr std::string_view op = "attention_decode";
  checks::check_attention_call(op, args.shape, args.encoding, args.position);
  const PositionEncoding& encoding = *args.encoding;
  const int B = args.shape.batch, n = args.shape.seq_len, H = args.shape.n_head, d = args.shape.head_dim;
  const bool transforms = encoding.transforms_qk(), has_bias = encoding.has_score_bias();
  const bool reencode = transforms && encoding.transform_varies_with_length();
  const int W = transforms ? encoding.qk_width(d) : d;
  const std::int64_t C = std::int64_t(H) * d, stride = 3 * C;
  const int p0 = args.position.position_offset, total = p0 + n;
  const KvCacheLayer& cache = args.cache;
  check_cache_tensor(op, "cache.keys", cache.keys, dtype_of<Real>(), B, H, W);
  check_cache_tensor(op, "cache.values", cache.values, dtype_of<Real>(), B, H, d);
  const std::int64_t capacity = cache.keys.shape[2];
  require(cache.values.shape[2] == capacity, op, "cache.values holds another number of rows than cache.keys");
  if (reencode) {
    check_cache_tensor(op, "cache.raw_keys", cache.raw_keys, dtype_of<Real>(), B, H, d);
    require(cache.raw_keys.shape[2] == capacity, op, "cache.raw_keys holds another number of rows than cache.keys");
  }
  require(total <= capacity, op,
          fmt::format("{} cached + {} new rows exceed the cache's capacity of {}", p0, n, capacity));
  require(args.past.dtype == DType::i32 && args.past.numel() == 1 && *args.past.as<std::int32_t>() == p0, op,
          fmt::format("past must be an i32 [1] holding the cached length {}", p0));
  check_matrix(op, "qkv", args.qkv, dtype_of<Real>(), std::int64_t(B) * n, stride);
  check_matrix(op, "out", args.out, dtype_of<Real>(), std::int64_t(B) * n, C);
  const auto param_ptrs =
      position_parameter_pointers<const Real*>(op, "position_params", args.position_params, encoding, H, d);
  const ParamValues<Real> params(param_ptrs);
  // The call the new rows' scores belong to: positions [0, total).
  const PositionContext full{total, args.position.train_length, H, d, 0};
  const PositionContext fresh{n, args.position.train_length, H, d, p0};
  const Real scale = Real(encoding.softmax_scale(full));
  const Real* qkv = args.qkv.as<Real>();
  Real* out = args.out.as<Real>();

  parallel_for(threads, H, [&](std::int64_t head) {
    const int h = int(head);
    std::vector<Real> bias(static_cast<std::size_t>(total), Real(0)), query(static_cast<std::size_t>(n) * W),
        scores(static_cast<std::size_t>(total));
    if (has_bias) encoding.score_bias(full, h, params, bias.data());
    auto transform = [&](const PositionContext& ctx, bool is_key, const Real* x, std::int64_t x_stride, Real* y) {
      QkTransformArgs<Real> t;
      t.ctx = &ctx;
      t.head = h;
      t.is_key = is_key;
      t.x = x;
      t.x_stride = x_stride;
      t.y = y;
      t.params = params;
      encoding.transform_qk(t);
    };
    for (int b = 0; b < B; ++b) {
      const std::int64_t slot = (std::int64_t(b) * H + h) * capacity;
      Real* keys = cache.keys.as<Real>() + slot * W;
      Real* values = cache.values.as<Real>() + slot * d;
      const Real* rows = qkv + std::int64_t(b) * n * stride + std::int64_t(h) * d;  // row i: q at +0, k +C, v +2C
      for (int i = 0; i < n; ++i) std::copy_n(rows + i * stride + 2 * C, d, values + std::int64_t(p0 + i) * d);
      if (reencode) {
        Real* raw = cache.raw_keys.as<Real>() + slot * d;
        for (int i = 0; i < n; ++i) std::copy_n(rows + i * stride + C, d, raw + std::int64_t(p0 + i) * d);
        transform(full, true, raw, d, keys);
      } else if (transforms) {
        transform(fresh, true, rows + C, stride, keys + std::int64_t(p0) * W);
      } else {
        for (int i = 0; i < n; ++i) std::copy_n(rows + i * stride + C, d, keys + std::int64_t(p0 + i) * W);
      }
      const Real* q = rows;
      std::int64_t q_stride = stride;
      if (transforms) {
        transform(fresh, false, rows, stride, query.data());
        q = query.data();
        q_stride = W;
      }
      for (int i = 0; i < n; ++i) {
        const int t = p0 + i;
        const Real* qt = q + i * q_stride;
        Real max_score = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          Real dot = 0;
          const Real* ks = keys + std::int64_t(s) * W;
          for (int c = 0; c < W; ++c) dot += qt[c] * ks[c];
          scores[std::size_t(s)] = dot * scale + bias[std::size_t(t - s)];
          max_score = std::max(max_score, scores[std::size_t(s)]);
        }
        Real sum = 0;
        for (int s = 0; s <= t; ++s) sum += (scores[std::size_t(s)] = std::exp(scores[std::size_t(s)] - max_score));
        Real* y = out + (std::int64_t(b) * n + i) * C + std::int64_t(h) * d;
        std::fill(y, y + d, Real(0));
        for (int s = 0; s <= t; ++s) {
          const Real weight = scores[std::size_t(s)] / sum;
          const Real* value = values + std::int64_t(s) * d;
          for (int c = 0; c < d; ++c) y[c] += weight * value[c];
        }
      }
    }
  });
}

template void attention_decode<float>(int, const AttentionDecode&);
template void attention_decode<double>(int, const AttentionDecode&);

}  // namespace pope::cpu
