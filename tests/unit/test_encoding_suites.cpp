// The generic suites every registered positional encoding passes (position/registry.hpp:
// one instance per method, aliases aside), so that a new encoding is tested without editing a
// test: the attention's gradients (inputs and the encoding's parameters) against finite
// differences in double at an awkward length, float results independent of the thread count,
// the backend-neutral plan against the CPU reference hooks (the plan is what the GPU runs), and
// a training run's checkpoint round trip and exact resume. GPU parity against this reference is
// the same registry's suite in tests/gpu/test_cuda_attention.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "attention_case.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu_gradient_check.hpp"
#include "model/parameter_init.hpp"
#include "model_shape.hpp"
#include "pope/rng.hpp"
#include "position_test_support.hpp"
#include "position/pj_bias_math.hpp"
#include "position/registry.hpp"
#include "trainer_fixture.hpp"

using namespace pope;
using pope::test::AttentionCase;
using pope::test::expect_gradient_matches;
using pope::test::numerical_gradient;
using pope::test::weighted_sum;

namespace {

// Head dim 8 takes every method's constraints (RoPE pairs, PJ-rotary blocks of 4 at K = 1).
constexpr int kHeads = 2;
constexpr int kHeadDim = 8;

ModelConfig model_for(const std::string& kind, int context_length) {
  return pope::testing::model_config({.n_head = kHeads, .n_embd = kHeads * kHeadDim, .context_length = context_length},
                               kind);
}

// The encoding's initial parameter values plus N(0, 0.2²) noise: where training starts, moved
// off exact zeros (T5's buckets, PoPE's δ) so that no gradient is trivially zero.
template <class Real>
void set_parameters(const PositionEncoding& encoding, AttentionCase<Real>& c, std::uint64_t seed) {
  Rng rng(seed);
  const std::vector<ParamSpec> specs = encoding.layer_parameters(c.n_head, c.head_dim);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<double> values(c.params[i].size());
    initialize_parameter(specs[i], rng, values,
                         [&](std::span<double> out) { encoding.initialize_custom(i, out, c.n_head, c.head_dim); });
    for (std::size_t j = 0; j < values.size(); ++j) c.params[i][j] = Real(values[j] + 0.2 * rng.normal());
  }
}

class EncodingSuite : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<PositionEncoding> make(int context_length) const {
    return make_position_encoding(model_for(GetParam(), context_length));
  }
};

TEST_P(EncodingSuite, AttentionGradientsMatchFiniteDifferences) {
  constexpr int T = 7, kTrain = 16;  // not a power of two; below L_train for RoPE
  const auto encoding = make(kTrain);
  auto backend = make_cpu_backend("double", 2);
  AttentionCase<double> c(*encoding, 2, T, kHeads, kHeadDim, 11, kTrain);
  set_parameters(*encoding, c, 12);
  c.forward(*backend, *encoding);
  const std::vector<std::vector<double>> grads_before = c.grads;
  c.backward(*backend, *encoding);
  const std::vector<double> weights = c.dout;
  auto loss = [&] {
    c.forward(*backend, *encoding);
    return weighted_sum(c.out, weights);
  };
  expect_gradient_matches(c.dqkv, numerical_gradient(c.qkv, loss), "dqkv", 1e-6);
  // A parameter may have no effect here (the PJ-bias keeps the parameters of its disabled
  // sectors), so each must match, and at least one must matter.
  const std::vector<ParamSpec> specs = encoding->layer_parameters(kHeads, kHeadDim);
  double largest = 0.0;
  for (std::size_t p = 0; p < c.params.size(); ++p) {
    const std::vector<double> numeric = numerical_gradient(c.params[p], loss);
    for (std::size_t i = 0; i < numeric.size(); ++i) {
      largest = std::max(largest, std::abs(numeric[i]));
      ASSERT_NEAR(c.grads[p][i] - grads_before[p][i], numeric[i], 1e-6 * std::max(1.0, std::abs(numeric[i])))
          << "d" << specs[p].name << " element " << i;
    }
  }
  if (!c.params.empty()) {
    EXPECT_GT(largest, 1e-3) << "no parameter moves the loss: the check would prove nothing";
  }
}

TEST_P(EncodingSuite, FloatResultsDoNotDependOnThreadCount) {
  constexpr int T = 37;
  const auto encoding = make(64);
  std::vector<AttentionCase<float>> runs;
  for (int threads : {1, 2}) {
    auto backend = make_cpu_backend("float", threads);
    AttentionCase<float> c(*encoding, 3, T, kHeads, kHeadDim, 21, 64);
    set_parameters(*encoding, c, 22);
    c.forward(*backend, *encoding);
    c.backward(*backend, *encoding);
    runs.push_back(std::move(c));
  }
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(runs[0].out, runs[1].out)) << "out";
  EXPECT_TRUE(same(runs[0].lse, runs[1].lse)) << "lse";
  EXPECT_TRUE(same(runs[0].dqkv, runs[1].dqkv)) << "dqkv";
  for (std::size_t p = 0; p < runs[0].grads.size(); ++p) EXPECT_TRUE(same(runs[0].grads[p], runs[1].grads[p])) << p;
}

// What the plan's transform does to one head's rows, evaluated here from the plan alone, in
// double; nullopt for the kinds this check leaves to the GPU suite (jet_rotary).
std::optional<std::vector<double>> planned_transform(const TransformPlan& plan, const PositionContext& ctx,
                                                     const std::vector<double>& x, int width, bool is_key,
                                                     const double* delta_row) {
  const int d = ctx.head_dim;
  std::vector<double> y(std::size_t(ctx.seq_len) * width, 0.0);
  for (int t = 0; t < ctx.seq_len; ++t) {
    const double p = ctx.position_offset + t;
    const double* in = x.data() + std::size_t(t) * d;
    double* out = y.data() + std::size_t(t) * width;
    switch (plan.kind) {
      case TransformKind::identity:
        std::copy(in, in + d, out);
        break;
      case TransformKind::rotary: {
        const int pairs = int(plan.frequencies.size());
        for (int c = 2 * pairs; c < d; ++c) out[c] = in[c];
        for (int m = 0; m < pairs; ++m) {
          double s = 1.0;
          if (!plan.scale_rates.empty()) s = std::exp((is_key ? -1 : 1) * plan.scale_rates[m] * (p - plan.scale_centre));
          const double angle = p * plan.frequencies[m];
          out[m] = s * (in[m] * std::cos(angle) - in[m + pairs] * std::sin(angle));
          out[m + pairs] = s * (in[m] * std::sin(angle) + in[m + pairs] * std::cos(angle));
        }
        break;
      }
      case TransformKind::polar:
        for (int c = 0; c < d; ++c) {
          const double v = in[c];
          const double mu = plan.magnitude == MagnitudeKind::softplus ? std::log1p(std::exp(v))
                            : plan.magnitude == MagnitudeKind::relu   ? std::max(v, 0.0)
                                                                      : v;
          double phase = p * plan.frequencies[c];
          if (is_key && delta_row != nullptr)
            phase += plan.clamp_delta ? std::clamp(delta_row[c], -2.0 * std::numbers::pi, 0.0) : delta_row[c];
          out[c] = mu * std::cos(phase);
          out[d + c] = mu * std::sin(phase);
        }
        break;
      case TransformKind::jet_rotary:
        return std::nullopt;
    }
  }
  return y;
}

TEST_P(EncodingSuite, PlanDescribesTheCpuReference) {
  constexpr int T = 13, kTrain = 16;
  const auto encoding = make(kTrain);
  AttentionCase<double> c(*encoding, 1, T, kHeads, kHeadDim, 31, kTrain);
  set_parameters(*encoding, c, 32);
  PositionContext ctx = c.context();
  ctx.position_offset = 3;
  const EncodingPlan plan = encoding->plan(ctx);
  const int width = encoding->qk_width(kHeadDim);
  EXPECT_EQ(width, plan.transform.kind == TransformKind::polar ? 2 * kHeadDim : kHeadDim);
  EXPECT_EQ(encoding->transforms_qk(), plan.transform.kind != TransformKind::identity);
  EXPECT_EQ(encoding->has_score_bias(), plan.bias.kind != BiasKind::none);
  const std::size_t param_count = c.params.size();
  std::vector<const double*> params;
  for (const auto& p : c.params) params.push_back(p.data());

  // The transform, for both sides of every head.
  if (plan.transform.delta_param >= 0) {
    ASSERT_LT(std::size_t(plan.transform.delta_param), param_count);
  }
  const std::vector<double> x = test::random_values(std::size_t(T) * kHeadDim, 33);
  for (int h = 0; h < kHeads; ++h)
    for (bool is_key : {false, true}) {
      const double* delta =
          plan.transform.delta_param < 0 ? nullptr : params[std::size_t(plan.transform.delta_param)] + h * kHeadDim;
      const auto want = planned_transform(plan.transform, ctx, x, width, is_key, delta);
      if (!want) continue;
      const std::vector<double> got =
          encoding->transforms_qk() ? pope::testing::transform_rows(*encoding, ctx, h, is_key, x, kHeadDim, c.params) : x;
      ASSERT_EQ(got.size(), want->size());
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], (*want)[i], 1e-12 * std::max(1.0, std::abs((*want)[i])))
            << (is_key ? "key" : "query") << " head " << h << " element " << i;
    }

  // The bias table.
  std::vector<double> table(T);
  switch (plan.bias.kind) {
    case BiasKind::none:
    case BiasKind::host_table:
      break;
    case BiasKind::linear:
      ASSERT_EQ(plan.bias.slopes.size(), std::size_t(kHeads));
      for (int h = 0; h < kHeads; ++h) {
        encoding->score_bias(ctx, h, params, table.data());
        for (int lag = 0; lag < T; ++lag) EXPECT_DOUBLE_EQ(table[lag], plan.bias.slopes[h] * lag) << h << " " << lag;
      }
      break;
    case BiasKind::lag_buckets: {
      const LagBucketPlan& b = plan.bias.buckets;
      ASSERT_LT(std::size_t(b.param), param_count);
      ASSERT_EQ(b.bucket_of_lag.size(), std::size_t(T));
      for (int lag = 0; lag < T; ++lag) {
        ASSERT_GE(b.bucket_of_lag[lag], lag == 0 ? 0 : b.bucket_of_lag[lag - 1]) << "buckets must not decrease";
        ASSERT_LT(b.bucket_of_lag[lag], b.buckets);
      }
      for (int h = 0; h < kHeads; ++h) {
        encoding->score_bias(ctx, h, params, table.data());
        for (int lag = 0; lag < T; ++lag)
          EXPECT_EQ(table[lag], params[b.param][h * b.buckets + b.bucket_of_lag[lag]]) << h << " " << lag;
      }
      break;
    }
    case BiasKind::pj:
      EXPECT_LE(std::size_t(plan.bias.pj.first_param) + kPjParamCount, param_count);
      EXPECT_EQ(plan.bias.pj.train_length, kTrain);
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, EncodingSuite, ::testing::ValuesIn(position_kinds()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Training through the Trainer: a checkpoint written and read back, and a run stopped and
// resumed equal to the uninterrupted one, for every method.
class EncodingTrainingSuite : public pope::testing::TrainerRunTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(EncodingTrainingSuite, ResumeReproducesTheUninterruptedRunExactly) {
  config_.model.position.kind = GetParam();
  config_.model.n_head = 4;  // head dim 8
  config_.train.steps = 6;
  expect_resume_equals_uninterrupted(3);
}

INSTANTIATE_TEST_SUITE_P(Registry, EncodingTrainingSuite, ::testing::ValuesIn(position_kinds()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
