// The model's FP8 path (Model::set_fp8) on the CPU backend, whose FP8 ops are exact: the loss and
// every parameter's gradient stay close to the exact (f64) model's, for RoPE and PoPE. The steps
// after the first, which cast with delayed scales, stay close too, and so does validation; and
// activation recompute changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model_shape.hpp"
#include "random_tokens.hpp"
#include "vector_compare.hpp"
#include "pope/backend.hpp"
#include "pope/model.hpp"
#include "pope/rng.hpp"

namespace {

using namespace pope;

ModelConfig fp8_test_model(const std::string& kind) {
  ModelConfig c = pope::testing::model_config(
      pope::testing::ModelShape{.vocab_size = 61, .padded_vocab_size = 64, .n_layer = 2, .n_head = 2, .n_embd = 32,
                          .context_length = 16},
      kind);
  c.position.pope.delta_init = DeltaInit::uniform;
  return c;
}

using pope::testing::cosine;
using pope::testing::norm_ratio;
using pope::testing::random_tokens;

class ModelFp8 : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelFp8, LossAndEveryGradientStayCloseToTheExactModels) {
  const ModelConfig c = fp8_test_model(GetParam());
  auto exact_backend = make_backend(DeviceChoice::cpu, "double", 1), fp8_backend = make_backend(DeviceChoice::cpu, "double", 1);
  Model exact(c, *exact_backend), fp8(c, *fp8_backend);
  exact.initialize(5);
  fp8.initialize(5);
  fp8.set_fp8(4);
  Rng rng(6);
  const int B = 4, T = 16;
  for (int step = 0; step < 3; ++step) {  // the first casts calibrate; the later ones use delayed scales
    const auto tokens = random_tokens(rng, B * T, c.vocab_size), targets = random_tokens(rng, B * T, c.vocab_size);
    exact.zero_gradients();
    fp8.zero_gradients();
    const double scale = 1.0 / (B * T);
    const LossSum want = exact.forward_backward(tokens.data(), targets.data(), B, T, scale);
    const LossSum got = fp8.forward_backward(tokens.data(), targets.data(), B, T, scale);
    EXPECT_NEAR(got.mean(), want.mean(), 0.01 * want.mean()) << "step " << step;
    const LossSum validated = fp8.forward(tokens.data(), targets.data(), B, T);
    EXPECT_NEAR(validated.mean(), want.mean(), 0.01 * want.mean()) << "step " << step;

    std::vector<double> want_grads(std::size_t(exact.gradients().numel())), got_grads(want_grads.size());
    exact_backend->copy_to_host(want_grads.data(), exact.gradients());
    fp8_backend->copy_to_host(got_grads.data(), fp8.gradients());
    EXPECT_GT(cosine(got_grads, want_grads), 0.995) << "step " << step;
    const ParameterLayout& layout = exact.layout();
    for (std::size_t p = 0; p < layout.specs().size(); ++p) {
      const Tensor w = layout.view(exact.gradients(), p), g = layout.view(fp8.gradients(), p);
      const auto offset = [&](const Tensor& view, const Tensor& arena) {
        return std::size_t(static_cast<const double*>(view.data) - static_cast<const double*>(arena.data));
      };
      const std::size_t begin = offset(w, exact.gradients()), n = std::size_t(w.numel());
      ASSERT_EQ(offset(g, fp8.gradients()), begin);
      const std::vector<double> a(got_grads.begin() + begin, got_grads.begin() + begin + n),
          b(want_grads.begin() + begin, want_grads.begin() + begin + n);
      if (std::all_of(b.begin(), b.end(), [](double v) { return v == 0.0; })) continue;  // padded vocabulary rows
      EXPECT_GT(cosine(a, b), 0.98) << layout.specs()[p].name << ", step " << step;
      EXPECT_NEAR(norm_ratio(a, b), 1.0, 0.1) << layout.specs()[p].name << ", step " << step;
    }
    // Both models take the same plain SGD step, so that later steps start from equal weights.
    std::vector<double> weights(want_grads.size());
    exact_backend->copy_to_host(weights.data(), exact.parameters());
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] -= 0.5 * want_grads[i];
    exact_backend->copy_from_host(exact.parameters(), weights.data());
    fp8_backend->copy_from_host(fp8.parameters(), weights.data());
    exact.refresh_compute_weights();
    fp8.refresh_compute_weights();
  }
  // Micro-batches accumulate: a second backward of the same batch doubles the gradients.
  const auto tokens = random_tokens(rng, B * T, c.vocab_size), targets = random_tokens(rng, B * T, c.vocab_size);
  fp8.zero_gradients();
  fp8.forward_backward(tokens.data(), targets.data(), B, T, 1.0);
  std::vector<double> once(std::size_t(fp8.gradients().numel())), twice(once.size());
  fp8_backend->copy_to_host(once.data(), fp8.gradients());
  fp8.forward_backward(tokens.data(), targets.data(), B, T, 1.0);
  fp8_backend->copy_to_host(twice.data(), fp8.gradients());
  double ratio = 0, norm = 0;
  for (std::size_t i = 0; i < once.size(); ++i) {
    ratio += twice[i] * once[i];
    norm += once[i] * once[i];
  }
  EXPECT_NEAR(ratio / norm, 2.0, 0.15);  // 1 if the second overwrote the first; FP8 noise aside, 2
}

INSTANTIATE_TEST_SUITE_P(Encodings, ModelFp8, ::testing::Values("rope", "pope"));

}  // namespace

namespace {

// Activation recompute changes nothing under FP8: its backward reads the inputs' FP8 transposes,
// so the loss and the gradients are bitwise those without recompute.
TEST(ModelFp8Recompute, GivesBitwiseTheSameLossAndGradients) {
  const ModelConfig c = fp8_test_model("pope");
  auto plain_backend = make_backend(DeviceChoice::cpu, "double", 1), recompute_backend = make_backend(DeviceChoice::cpu, "double", 1);
  Model plain(c, *plain_backend), recomputed(c, *recompute_backend);
  for (Model* m : {&plain, &recomputed}) {
    m->initialize(9);
    m->set_fp8(2);
  }
  recomputed.set_activation_recompute(true);
  Rng rng(10);
  const auto tokens = random_tokens(rng, 32, c.vocab_size), targets = random_tokens(rng, 32, c.vocab_size);
  for (int step = 0; step < 2; ++step) {
    plain.zero_gradients();
    recomputed.zero_gradients();
    EXPECT_EQ(plain.forward_backward(tokens.data(), targets.data(), 2, 16, 1.0 / 32).sum,
              recomputed.forward_backward(tokens.data(), targets.data(), 2, 16, 1.0 / 32).sum);
    std::vector<double> a(std::size_t(plain.gradients().numel())), b(a.size());
    plain_backend->copy_to_host(a.data(), plain.gradients());
    recompute_backend->copy_to_host(b.data(), recomputed.gradients());
    EXPECT_EQ(a, b) << "step " << step;
  }
}

}  // namespace
