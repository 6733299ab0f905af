// One attention call on the CPU backend over host vectors of Real (float or double): random
// inputs, the encoding's parameters and gradient accumulators, and the forward and backward
// through Backend's entry points. Shared by the CPU attention tests and the encoding suites.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu_gradient_check.hpp"
#include "pope/backend.hpp"
#include "pope/position.hpp"

namespace pope::test {

// Inputs, outputs and gradients of one attention call, in host vectors of Real.
template <class Real> struct AttentionCase {
  int batch, seq_len, n_head, head_dim, train_length;
  std::vector<Real> qkv, out, lse, dout, dqkv;
  std::vector<std::vector<Real>> params, grads;

  // Random inputs; parameters N(0, 0.5²) and gradient accumulators N(0, 1). train_length 0: T.
  AttentionCase(const PositionEncoding& encoding, int b, int t, int h, int d, std::uint64_t seed, int train = 0)
      : batch(b), seq_len(t), n_head(h), head_dim(d), train_length(train > 0 ? train : t) {
    const std::size_t rows = std::size_t(b) * t, channels = std::size_t(h) * d;
    qkv = convert(random_values(rows * 3 * channels, seed));
    dout = convert(random_values(rows * channels, seed + 1));
    out.assign(rows * channels, Real(0));
    lse.assign(std::size_t(b) * h * t, Real(0));
    dqkv.assign(qkv.size(), Real(123));  // garbage: the backward must overwrite it
    std::uint64_t param_seed = seed + 2;
    for (const ParamSpec& spec : encoding.layer_parameters(h, d)) {
      params.push_back(convert(random_values(std::size_t(shape_numel(spec.shape)), param_seed++, 0.5)));
      grads.push_back(convert(random_values(params.back().size(), param_seed++)));  // accumulated onto
    }
  }
  static std::vector<Real> convert(const std::vector<double>& values) { return {values.begin(), values.end()}; }

  std::int64_t rows() const { return std::int64_t(batch) * seq_len; }
  std::int64_t channels() const { return std::int64_t(n_head) * head_dim; }
  AttentionShape shape() const { return {batch, seq_len, n_head, head_dim}; }
  PositionContext context() const {
    PositionContext ctx;
    ctx.seq_len = seq_len;
    ctx.train_length = train_length;
    ctx.n_head = n_head;
    ctx.head_dim = head_dim;
    return ctx;
  }
  static std::vector<Tensor> tensors(std::vector<std::vector<Real>>& values) {
    std::vector<Tensor> result;
    for (auto& v : values) result.push_back(host_tensor(v, {std::int64_t(v.size())}));
    return result;
  }

  void forward(Backend& backend, const PositionEncoding& encoding) {
    const std::vector<Tensor> param_tensors = tensors(params);
    AttentionForward args;
    args.shape = shape();
    args.encoding = &encoding;
    args.position = context();
    args.qkv = host_tensor(qkv, {rows(), 3 * channels()});
    args.out = host_tensor(out, {rows(), channels()});
    args.lse = host_tensor(lse, {batch, n_head, seq_len});
    args.position_params = param_tensors;
    backend.attention_forward(args);
  }
  void backward(Backend& backend, const PositionEncoding& encoding) {
    const std::vector<Tensor> param_tensors = tensors(params), grad_tensors = tensors(grads);
    AttentionBackward args;
    args.shape = shape();
    args.encoding = &encoding;
    args.position = context();
    args.qkv = host_tensor(qkv, {rows(), 3 * channels()});
    args.out = host_tensor(out, {rows(), channels()});
    args.lse = host_tensor(lse, {batch, n_head, seq_len});
    args.dout = host_tensor(dout, {rows(), channels()});
    args.dqkv = host_tensor(dqkv, {rows(), 3 * channels()});
    args.position_params = param_tensors;
    args.position_grads = grad_tensors;
    backend.attention_backward(args);
  }
};


}  // namespace pope::test
