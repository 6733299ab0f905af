// CPU attention: the streaming forward against a dense T×T reference computed here, the
// flash-style backward against finite differences (in double) for inputs and for the
// parameters of a test-local encoding with both hooks, and its determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cpu/cpu_backend.hpp"
#include "attention_case.hpp"
#include "cpu_gradient_check.hpp"

using namespace pope;
using pope::test::expect_gradient_matches;
using pope::test::host_tensor;
using pope::test::numerical_gradient;
using pope::test::random_values;
using pope::test::weighted_sum;
using pope::test::AttentionCase;

namespace {

// A toy encoding that exercises every hook with learnable per-head parameters:
//   transform (optional, doubles the QK width):
//     q̃ = [a_h ⊙ q, u_h · q²],  k̃ = [a_h ⊙ k, w_h · k²]   (a: "linear" [H, d]; u, w: [H])
//   bias (optional): b_h(Δ) = −c_h · Δ + e_h · cos Δ       ("slope" c, "wave" e: [H])
// Queries and keys use different square coefficients so a swapped is_key shows.
class ToyEncoding final : public PositionEncodingImpl<ToyEncoding> {
 public:
  ToyEncoding(bool transform, bool bias) : transform_(transform), bias_(bias) {}

  std::string kind() const override { return "toy"; }
  bool transforms_qk() const override { return transform_; }
  int qk_width(int head_dim) const override { return transform_ ? 2 * head_dim : head_dim; }
  bool has_score_bias() const override { return bias_; }
  double softmax_scale(const PositionContext& ctx) const override {
    return 1.0 / std::sqrt(double(qk_width(ctx.head_dim)));
  }
  std::vector<ParamSpec> layer_parameters(int n_head, int head_dim) const override {
    std::vector<ParamSpec> specs;
    if (transform_) {
      specs.push_back({"linear", {n_head, head_dim}});
      specs.push_back({"query_square", {n_head}});
      specs.push_back({"key_square", {n_head}});
    }
    if (bias_) {
      specs.push_back({"slope", {n_head}});
      specs.push_back({"wave", {n_head}});
    }
    return specs;
  }

  template <class Real> void transform(const QkTransformArgs<Real>& args) const {
    const int d = args.ctx->head_dim, h = args.head;
    const Real* a = args.params[0] + h * d;
    const Real square = args.params[args.is_key ? 2 : 1][h];
    for (int t = 0; t < args.ctx->seq_len; ++t) {
      const Real* x = args.x + t * args.x_stride;
      Real* y = args.y + t * 2 * d;
      for (int i = 0; i < d; ++i) {
        y[i] = a[i] * x[i];
        y[d + i] = square * x[i] * x[i];
      }
    }
  }
  template <class Real> void transform_backward(const QkTransformBackwardArgs<Real>& args) const {
    const int d = args.ctx->head_dim, h = args.head;
    const Real* a = args.params[0] + h * d;
    const int square_index = args.is_key ? 2 : 1;
    const Real square = args.params[square_index][h];
    Real* da = args.dparams[0] + h * d;
    Real& dsquare = args.dparams[square_index][h];
    for (int t = 0; t < args.ctx->seq_len; ++t) {
      const Real *x = args.x + t * args.x_stride, *dy = args.dy + t * 2 * d;
      Real* dx = args.dx + t * args.dx_stride;
      for (int i = 0; i < d; ++i) {
        dx[i] += a[i] * dy[i] + 2 * square * x[i] * dy[d + i];
        da[i] += x[i] * dy[i];
        dsquare += x[i] * x[i] * dy[d + i];
      }
    }
  }
  template <class Real> void bias(const PositionContext& ctx, int h, ParamValues<Real> params, Real* table) const {
    const std::size_t first = bias_offset();
    for (int delta = 0; delta < ctx.seq_len; ++delta)
      table[delta] = -params[first][h] * Real(delta) + params[first + 1][h] * std::cos(Real(delta));
  }
  template <class Real>
  void bias_backward(const PositionContext& ctx, int h, ParamValues<Real>, const Real* diag, ParamGrads<Real> dparams) const {
    const std::size_t first = bias_offset();
    for (int delta = 0; delta < ctx.seq_len; ++delta) {
      dparams[first][h] += -Real(delta) * diag[delta];
      dparams[first + 1][h] += std::cos(Real(delta)) * diag[delta];
    }
  }

 private:
  std::size_t bias_offset() const { return transform_ ? 3 : 0; }
  bool transform_, bias_;
};

// Claims a transform but provides none: the base class throws from inside the parallel
// region, which must reach the caller as an exception.
class BrokenEncoding final : public PositionEncoding {
 public:
  std::string kind() const override { return "broken"; }
  bool transforms_qk() const override { return true; }
};

struct Variant {
  const char* name;
  bool transform, bias;
};
const Variant kVariants[] = {{"plain", false, false}, {"bias only", false, true}, {"transform and bias", true, true}};

// Dense reference: the full T×T score matrix of each (batch, head), masked above the
// diagonal, a plain softmax, out = P·V and lse per row.
void dense_reference(const PositionEncoding& encoding, AttentionCase<double>& c, std::vector<double>& out,
                     std::vector<double>& lse) {
  const int T = c.seq_len, d = c.head_dim, width = encoding.qk_width(d);
  const std::int64_t C = c.channels(), stride = 3 * C;
  const PositionContext ctx = c.context();
  const double scale = encoding.softmax_scale(ctx);
  std::vector<const double*> params;
  for (auto& p : c.params) params.push_back(p.data());
  out.assign(c.out.size(), 0.0);
  lse.assign(c.lse.size(), 0.0);
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.n_head; ++h) {
      const double* q = c.qkv.data() + std::int64_t(b) * T * stride + h * d;
      const double* k = q + C;
      const double* v = q + 2 * C;
      std::vector<double> qt(std::size_t(T) * width), kt(std::size_t(T) * width), bias(T, 0.0);
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < d; ++i) {
          qt[t * width + i] = q[t * stride + i];
          kt[t * width + i] = k[t * stride + i];
        }
      for (bool is_key : {false, true}) {
        if (!encoding.transforms_qk()) break;
        QkTransformArgs<double> args;
        args.ctx = &ctx;
        args.head = h;
        args.is_key = is_key;
        args.x = is_key ? k : q;
        args.x_stride = stride;
        args.y = is_key ? kt.data() : qt.data();
        args.params = params;
        encoding.transform_qk(args);
      }
      if (encoding.has_score_bias()) encoding.score_bias(ctx, h, params, bias.data());

      std::vector<double> scores(std::size_t(T) * T, -INFINITY);
      for (int t = 0; t < T; ++t)
        for (int s = 0; s <= t; ++s) {
          double dot = 0;
          for (int i = 0; i < width; ++i) dot += qt[t * width + i] * kt[s * width + i];
          scores[t * T + s] = dot * scale + bias[t - s];
        }
      for (int t = 0; t < T; ++t) {
        double normaliser = 0;
        for (int s = 0; s < T; ++s) normaliser += std::exp(scores[t * T + s]);  // exp(−inf) = 0 masks
        lse[(std::size_t(b) * c.n_head + h) * T + t] = std::log(normaliser);
        double* y = out.data() + (std::int64_t(b) * T + t) * C + h * d;
        for (int s = 0; s < T; ++s)
          for (int i = 0; i < d; ++i) y[i] += std::exp(scores[t * T + s]) / normaliser * v[s * stride + i];
      }
    }
  }
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(CpuAttention, ForwardMatchesDenseReferenceForOddLengths) {
  auto backend = make_cpu_backend("double", 2);
  for (const Variant& variant : kVariants) {
    const ToyEncoding encoding(variant.transform, variant.bias);
    for (int T : {1, 7, 33}) {
      SCOPED_TRACE(::testing::Message() << variant.name << ", T = " << T);
      AttentionCase<double> c(encoding, 2, T, 3, 4, 100 + T);
      c.forward(*backend, encoding);
      std::vector<double> out, lse;
      dense_reference(encoding, c, out, lse);
      for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(c.out[i], out[i], 1e-12) << "out element " << i;
      for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(c.lse[i], lse[i], 1e-12) << "lse element " << i;
    }
  }
}

TEST(CpuAttention, BackwardMatchesFiniteDifferences) {
  auto backend = make_cpu_backend("double", 2);
  for (const Variant& variant : kVariants) {
    const ToyEncoding encoding(variant.transform, variant.bias);
    for (int T : {1, 7}) {
      SCOPED_TRACE(::testing::Message() << variant.name << ", T = " << T);
      AttentionCase<double> c(encoding, 2, T, 2, 3, 200 + T);
      c.forward(*backend, encoding);
      const std::vector<std::vector<double>> grads_before = c.grads;
      c.backward(*backend, encoding);

      std::vector<double> weights = c.dout;
      auto loss = [&] {
        c.forward(*backend, encoding);
        return weighted_sum(c.out, weights);
      };
      expect_gradient_matches(c.dqkv, numerical_gradient(c.qkv, loss), "dqkv");
      for (std::size_t p = 0; p < c.params.size(); ++p) {
        std::vector<double> added(c.params[p].size());
        for (std::size_t i = 0; i < added.size(); ++i) added[i] = c.grads[p][i] - grads_before[p][i];
        const std::string name = "d" + encoding.layer_parameters(c.n_head, c.head_dim)[p].name;
        if (T == 1) {
          // A single key gets probability 1 whatever its score: no parameter can matter.
          for (double g : added) EXPECT_NEAR(g, 0.0, 1e-12) << name;
          continue;
        }
        expect_gradient_matches(added, numerical_gradient(c.params[p], loss), name);
      }
    }
  }
}

// With q = k = 0 every score is 0, so out_t is the mean of v_0..v_t and lse_t = log(t+1):
// a closed form at a length where a T×T matrix per head would be large.
TEST(CpuAttention, LongContextUniformAttention) {
  auto backend = make_cpu_backend("double", 2);
  const ToyEncoding encoding(false, false);
  const int T = 4096;
  AttentionCase<double> c(encoding, 1, T, 1, 2, 300);
  for (int t = 0; t < T; ++t) {
    c.qkv[t * 6 + 0] = c.qkv[t * 6 + 1] = c.qkv[t * 6 + 2] = c.qkv[t * 6 + 3] = 0.0;
    c.qkv[t * 6 + 4] = t;          // v = (t, 1)
    c.qkv[t * 6 + 5] = 1.0;
  }
  c.forward(*backend, encoding);
  for (int t : {0, 1, 100, T - 1}) {
    EXPECT_NEAR(c.out[t * 2 + 0], t / 2.0, 1e-9 * T) << "row " << t;
    EXPECT_NEAR(c.out[t * 2 + 1], 1.0, 1e-12) << "row " << t;
    EXPECT_NEAR(c.lse[t], std::log(t + 1.0), 1e-12) << "row " << t;
  }
}

TEST(CpuAttention, FloatResultsDoNotDependOnThreadCount) {
  const ToyEncoding encoding(true, true);
  auto run = [&](int threads) {
    auto backend = make_cpu_backend("float", threads);
    AttentionCase<float> c(encoding, 2, 33, 4, 8, 400);
    c.forward(*backend, encoding);
    c.backward(*backend, encoding);
    return c;
  };
  const AttentionCase<float> one = run(1), two = run(2);
  EXPECT_TRUE(bitwise_equal(one.out, two.out));
  EXPECT_TRUE(bitwise_equal(one.lse, two.lse));
  EXPECT_TRUE(bitwise_equal(one.dqkv, two.dqkv));
  for (std::size_t p = 0; p < one.grads.size(); ++p) EXPECT_TRUE(bitwise_equal(one.grads[p], two.grads[p])) << "param " << p;
}

TEST(CpuAttention, FloatAgreesWithDouble) {
  const ToyEncoding encoding(true, true);
  auto float_backend = make_cpu_backend("float", 1);
  auto double_backend = make_cpu_backend("double", 1);
  AttentionCase<float> f(encoding, 2, 17, 2, 8, 500);
  AttentionCase<double> d(encoding, 2, 17, 2, 8, 500);
  f.forward(*float_backend, encoding);
  f.backward(*float_backend, encoding);
  d.forward(*double_backend, encoding);
  d.backward(*double_backend, encoding);
  auto expect_close = [](const auto& single, const std::vector<double>& reference, double tolerance, const char* what) {
    ASSERT_EQ(single.size(), reference.size());
    for (std::size_t i = 0; i < reference.size(); ++i)
      ASSERT_NEAR(single[i], reference[i], tolerance * std::max(1.0, std::abs(reference[i]))) << what << " " << i;
  };
  expect_close(f.out, d.out, 1e-5, "out");
  expect_close(f.lse, d.lse, 1e-5, "lse");
  expect_close(f.dqkv, d.dqkv, 1e-4, "dqkv");
  for (std::size_t p = 0; p < d.grads.size(); ++p) expect_close(f.grads[p], d.grads[p], 1e-4, "position grad");
}

TEST(CpuAttention, RejectsInconsistentArguments) {
  auto backend = make_cpu_backend("double", 2);
  const ToyEncoding encoding(true, true);
  AttentionCase<double> c(encoding, 1, 5, 2, 3, 600);
  const std::vector<Tensor> params = AttentionCase<double>::tensors(c.params);
  AttentionForward args;
  args.shape = c.shape();
  args.encoding = &encoding;
  args.position = c.context();
  args.qkv = host_tensor(c.qkv, {c.rows(), 3 * c.channels()});
  args.out = host_tensor(c.out, {c.rows(), c.channels()});
  args.lse = host_tensor(c.lse, {1, 2, 5});
  args.position_params = params;
  EXPECT_NO_THROW(backend->attention_forward(args));

  AttentionForward wrong = args;
  wrong.encoding = nullptr;
  EXPECT_THROW(backend->attention_forward(wrong), std::invalid_argument);
  wrong = args;
  wrong.position.seq_len = 4;
  EXPECT_THROW(backend->attention_forward(wrong), std::invalid_argument);
  wrong = args;
  wrong.position_params = std::span<const Tensor>(params.data(), params.size() - 1);
  EXPECT_THROW(backend->attention_forward(wrong), std::invalid_argument);
  wrong = args;
  wrong.lse = host_tensor(c.lse, {10});
  wrong.lse.shape = {9};
  EXPECT_THROW(backend->attention_forward(wrong), std::invalid_argument);
  // attention.impl = cudnn is a CUDA-backend comparator; the CPU has only its reference.
  wrong = args;
  wrong.impl = AttentionImpl::cudnn;
  try {
    backend->attention_forward(wrong);
    ADD_FAILURE() << "expected the CPU backend to refuse attention.impl cudnn";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("attention.impl is cudnn"), std::string::npos) << error.what();
  }

  const BrokenEncoding broken;
  wrong = args;
  wrong.encoding = &broken;
  wrong.position_params = {};
  EXPECT_THROW(backend->attention_forward(wrong), std::logic_error);
}
