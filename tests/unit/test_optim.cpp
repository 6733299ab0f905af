// Learning-rate schedule and the AdamW step (clipping, decoupled decay, non-finite guard).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "pope/optim.hpp"
#include "model_shape.hpp"

using namespace pope;

TEST(LearningRate, WarmupThenCosineLinearOrConstant) {
  OptimConfig c;
  c.lr = 1e-3;
  c.min_lr = 1e-4;
  c.warmup_steps = 10;
  const long total = 110;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, total), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 4, total), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 9, total), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10, total), 1e-3);
  EXPECT_NEAR(learning_rate(c, 35, total), 1e-4 + 0.5 * (1 + std::cos(M_PI / 4)) * 9e-4, 1e-15);
  EXPECT_NEAR(learning_rate(c, 60, total), 5.5e-4, 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(c, 110, total), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 500, total), 1e-4);
  c.schedule = LrSchedule::linear;
  EXPECT_NEAR(learning_rate(c, 35, total), 1e-4 + 0.75 * 9e-4, 1e-15);
  c.schedule = LrSchedule::constant;
  EXPECT_DOUBLE_EQ(learning_rate(c, 35, total), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(c, 3, total), 4e-4);  // warmup still applies
}

namespace {
ModelConfig small_model() {
  return pope::testing::model_config({.vocab_size = 16, .padded_vocab_size = 16, .n_layer = 1, .n_embd = 8,
                                .context_length = 8},
                               "rope");
}
}  // namespace

TEST(AdamWStep, ClipsByGlobalNormAndDecaysOnlyMatrices) {
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  Model model(small_model(), *backend);
  model.initialize(1);
  OptimConfig oc;
  oc.weight_decay = 0.1;
  oc.grad_clip = 1.0;
  AdamW adamw(model, oc);
  double* p = model.parameters().as<double>();
  double* g = model.gradients().as<double>();
  const auto& layout = model.layout();
  const std::int64_t gain = layout.offset(layout.index_of("final_norm.weight"));     // no decay
  const std::int64_t matrix = layout.offset(layout.index_of("layers.0.mlp.fc.weight"));  // decay
  model.zero_gradients();
  g[gain] = 3.0;
  g[matrix] = -4.0;
  const double p_gain = p[gain], p_matrix = p[matrix], p_other = p[matrix + 1], p_gain2 = p[gain + 1];
  const double lr = 0.01;
  const auto r = adamw.step(1, lr);
  ASSERT_TRUE(r.applied);
  EXPECT_DOUBLE_EQ(r.grad_norm, 5.0);
  EXPECT_DOUBLE_EQ(r.clip_scale, 0.2);
  // First bias-corrected step: update = ĝ / (|ĝ| + eps) with ĝ the clipped gradient.
  const double eps = oc.eps;
  EXPECT_NEAR(p[gain], p_gain - lr * 0.6 / (0.6 + eps), 1e-12);
  EXPECT_NEAR(p[matrix], p_matrix - lr * (-0.8 / (0.8 + eps) + oc.weight_decay * p_matrix), 1e-12);
  EXPECT_NEAR(p[matrix + 1], p_other * (1 - lr * oc.weight_decay), 1e-15);  // zero gradient, decay only
  EXPECT_EQ(p[gain + 1], p_gain2);                                           // no gradient, no decay
}

TEST(AdamWStep, NonFiniteGradientLeavesEverythingUntouched) {
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  Model model(small_model(), *backend);
  model.initialize(1);
  AdamW adamw(model, OptimConfig{});
  model.zero_gradients();
  model.gradients().as<double>()[5] = std::numeric_limits<double>::quiet_NaN();
  const auto before = model.parameters_to_host();
  const auto r = adamw.step(1, 1e-3);
  EXPECT_FALSE(r.applied);
  EXPECT_TRUE(std::isnan(r.grad_norm));
  EXPECT_EQ(model.parameters_to_host(), before);
  const auto m = adamw.first_moment_to_host();
  for (float x : m) ASSERT_EQ(x, 0.0f);
}

// PoPE's δ under delta_bound project: an update that carries an entry past a bound leaves it
// exactly on that bound (rounded to the parameter dtype), one that stays inside is untouched;
// under none both leave it past. AdamW's first step moves each entry by ≈ lr against its
// gradient's sign.
TEST(AdamWStep, ProjectsPopeDeltaBackIntoItsBounds) {
  const float lowest = float(-2.0 * std::numbers::pi);
  const double lr = 0.01;
  for (const std::string precision : {"double", "float"})
    for (const DeltaBound bound : {DeltaBound::project, DeltaBound::none}) {
      SCOPED_TRACE(precision + ", delta_bound " + std::string(name_of(bound)));
      auto backend = make_backend(DeviceChoice::cpu, precision, 1);
      ModelConfig config = small_model();
      config.position.kind = "pope";
      config.position.pope.delta_bound = bound;
      Model model(config, *backend);
      model.initialize(1);
      AdamW adamw(model, OptimConfig{});
      const Tensor delta = model.layout().view(model.parameters(), "layers.0.position.delta");
      const Tensor grad = model.layout().view(model.gradients(), "layers.0.position.delta");
      std::vector<float> values(std::size_t(delta.numel()), 0.0f), grads(values.size(), 0.0f);
      values[1] = lowest + 0.0005f;
      grads[0] = -1.0f;  // up past 0
      grads[1] = 1.0f;   // down past −2π
      grads[2] = 1.0f;   // down, inside
      tensor_from_host_f32(*backend, delta, values);
      model.zero_gradients();
      tensor_from_host_f32(*backend, grad, grads);
      ASSERT_TRUE(adamw.step(1, lr).applied);
      const std::vector<float> after = tensor_to_host_f32(*backend, delta);
      if (bound == DeltaBound::project) {
        EXPECT_EQ(after[0], 0.0f);
        EXPECT_EQ(after[1], lowest);
      } else {
        EXPECT_NEAR(after[0], lr, 1e-6);
        EXPECT_NEAR(after[1], lowest + 0.0005f - lr, 1e-5);
      }
      EXPECT_NEAR(after[2], -lr, 1e-6);
      EXPECT_EQ(after[3], 0.0f);  // no gradient: no move
    }
}
