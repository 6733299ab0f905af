// The GPT over the CPU backend: parameter counts of the paper's models, whole-model
// finite-difference gradients in double under every encoding, masking and padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gradient_check.hpp"
#include "pope/backend.hpp"
#include "pope/model.hpp"
#include "pope/rng.hpp"
#include "model_shape.hpp"
#include "random_tokens.hpp"

using namespace pope;

namespace {

ModelConfig paper_model(int n_embd, int n_head, int n_layer, const std::string& kind) {
  ModelConfig c;
  c.n_embd = n_embd;
  c.n_head = n_head;
  c.n_layer = n_layer;
  c.position.kind = kind;
  return c;
}

// A RoPE model with 4 heads whose vocabulary of `vocab` tokens is padded to `padded` rows.
ModelConfig rope_model_with_vocabulary(int n_embd, int n_layer, int vocab, int padded) {
  ModelConfig c = paper_model(n_embd, 4, n_layer, "rope");
  c.vocab_size = vocab;
  c.padded_vocab_size = padded;
  return c;
}

ModelConfig tiny_model(const std::string& kind) {
  ModelConfig c = pope::testing::model_config(pope::testing::kTinyShape, kind);
  c.position.pope.delta_init = DeltaInit::uniform;  // non-zero δ so its gradient is exercised in general position
  c.init_std = 0.3;                        // larger weights: gradients well above rounding noise
  return c;
}

using pope::testing::random_tokens;

}  // namespace

TEST(ModelLayout, PaperParameterCounts) {
  // the PoPE paper: 123.5M, 252.8M, 772.1M with tied embeddings, vocabulary 50257 — the
  // weight matrices; the norm gains (2·n_layer + 1)·C and PoPE's δ come on top.
  const struct { int C, H, L; double millions; } cases[] = {{768, 12, 12, 123.5}, {1024, 16, 16, 252.8},
                                                            {1280, 20, 36, 772.1}};
  for (const auto& k : cases) {
    for (const std::string kind : {"rope", "pope"}) {
      const ModelConfig c = paper_model(k.C, k.H, k.L, kind);
      const auto layout = build_parameter_layout(c, *make_position_encoding(c));
      const std::int64_t matrices = count_matrix_parameters(c, layout);
      EXPECT_EQ(matrices, 50257LL * k.C + 12LL * k.L * k.C * k.C);
      EXPECT_NEAR(double(matrices) / 1e6, k.millions, 0.05) << kind << " n_embd " << k.C;
      const std::int64_t delta = kind == "pope" ? std::int64_t(k.L) * k.H * (k.C / k.H) : 0;
      EXPECT_EQ(count_parameters(c, layout), matrices + std::int64_t(2 * k.L + 1) * k.C + delta);
    }
  }
}

TEST(ModelLayout, NamesShapesAndWeightDecay) {
  const ModelConfig c = paper_model(768, 12, 2, "pope");
  const auto layout = build_parameter_layout(c, *make_position_encoding(c));
  EXPECT_EQ(layout.specs()[layout.index_of("wte.weight")].shape, (Shape{50304, 768}));
  EXPECT_EQ(layout.specs()[layout.index_of("layers.1.attn.qkv.weight")].shape, (Shape{2304, 768}));
  EXPECT_EQ(layout.specs()[layout.index_of("layers.0.mlp.proj.weight")].shape, (Shape{768, 3072}));
  EXPECT_EQ(layout.specs()[layout.index_of("layers.0.position.delta")].shape, (Shape{12, 64}));
  for (const auto& spec : layout.specs())
    EXPECT_EQ(spec.weight_decay, spec.shape.size() == 2 && spec.name.find("position") == std::string::npos)
        << spec.name;
}

TEST(ModelLayout, PjBiasParametersAreNamedPerLayerAndNotDecayed) {
  const ModelConfig c = paper_model(768, 12, 2, "pjrope");
  const auto layout = build_parameter_layout(c, *make_position_encoding(c));
  EXPECT_EQ(layout.specs()[layout.index_of("layers.1.position.omega")].shape, (Shape{12}));
  EXPECT_EQ(layout.specs()[layout.index_of("layers.0.position.gate_logits")].shape, (Shape{12, 3}));
  EXPECT_EQ(layout.specs()[layout.index_of("layers.0.position.lc_im")].shape, (Shape{12, 4}));  // K = 3
  for (const auto& spec : layout.specs()) {
    if (spec.name.find(".position.") != std::string::npos) {
      EXPECT_FALSE(spec.weight_decay) << spec.name;
    }
  }
  // 6 + 6(K + 1) scalars per head and layer on top of the weights and norm gains.
  const std::int64_t matrices = count_matrix_parameters(c, layout);
  EXPECT_EQ(count_parameters(c, layout), matrices + std::int64_t(2 * 2 + 1) * 768 + 2 * 12 * (6 + 6 * 4));
}

// ZeRO-1 broadcasts these ranges of fp32 masters each step (AdamW): they must hold every
// positional parameter and nothing else but its alignment padding, sorted and disjoint.
TEST(ModelLayout, MasterReadRangesAreExactlyThePositionalParameters) {
  auto backend = make_backend(DeviceChoice::cpu);
  for (const std::string kind : {"pjrope", "pope", "rope"}) {
    const Model model(paper_model(64, 4, 3, kind), *backend);
    const auto ranges = model.master_read_ranges();
    std::int64_t covered = 0, previous_end = 0;
    for (const auto& [begin, end] : ranges) {
      EXPECT_LE(previous_end, begin) << kind << ": ranges out of order or overlapping";
      EXPECT_LT(begin, end) << kind;
      covered += end - begin;
      previous_end = end;
    }
    std::int64_t positional = 0;
    const ParameterLayout& layout = model.layout();
    for (std::size_t i = 0; i < layout.specs().size(); ++i) {
      if (layout.specs()[i].name.find(".position.") == std::string::npos) continue;
      const std::int64_t begin = layout.offset(i), numel = shape_numel(layout.specs()[i].shape);
      positional += (i + 1 < layout.specs().size() ? layout.offset(i + 1) : layout.total_numel()) - begin;
      EXPECT_TRUE(std::any_of(ranges.begin(), ranges.end(),
                              [&](const auto& r) { return r.first <= begin && begin + numel <= r.second; }))
          << kind << ": " << layout.specs()[i].name << " is in no range";
    }
    EXPECT_EQ(covered, positional) << kind << ": the ranges hold more than the positional parameters";
    if (kind == "rope") {
      EXPECT_TRUE(ranges.empty());
    }
    if (kind == "pjrope") {
      EXPECT_EQ(ranges.size(), 3u) << "one merged range per layer";
    }
  }
}

TEST(ModelInit, PjBiasStartsAffine) {
  // gate_init affine: every layer's bias starts at ≈ −1.92933·Δ/L (the FJ/LC amplitudes
  // are 0.02·N(0, 1), so only approximately).
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  ModelConfig c = paper_model(64, 4, 2, "affine");
  c.context_length = 64;
  c.vocab_size = 100;
  c.padded_vocab_size = 128;
  Model model(c, *backend);
  model.initialize(5);
  const auto values = model.parameters_to_host();
  const auto at = [&](const std::string& name) { return values[std::size_t(model.layout().offset(model.layout().index_of(name)))]; };
  EXPECT_FLOAT_EQ(at("layers.1.position.gate_logits"), -2.0f);
  EXPECT_NEAR(std::log1p(std::exp(double(at("layers.0.position.affine_slope")))), 2.0, 1e-6);
  EXPECT_NEAR(at("layers.0.position.omega"), 2.0 * 3.141592653589793 / 64.0, 1e-7);
}

TEST(ModelInit, ScalesAndPaddingRows) {
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  const ModelConfig c = rope_model_with_vocabulary(64, 4, 1000, 1024);
  Model model(c, *backend);
  model.initialize(3);
  const auto values = model.parameters_to_host();
  auto stddev = [&](const std::string& name, std::int64_t count = -1) {
    const auto i = model.layout().index_of(name);
    const auto* p = values.data() + model.layout().offset(i);
    const std::int64_t n = count < 0 ? shape_numel(model.layout().specs()[i].shape) : count;
    double s = 0;
    for (std::int64_t k = 0; k < n; ++k) s += double(p[k]) * p[k];
    return std::sqrt(s / double(n));
  };
  EXPECT_NEAR(stddev("layers.0.mlp.fc.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("layers.3.attn.proj.weight"), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_NEAR(stddev("wte.weight", 1000 * 64), 0.02, 0.001);
  const auto wte = model.layout().offset(model.layout().index_of("wte.weight"));
  for (std::int64_t k = 1000 * 64; k < 1024 * 64; ++k) ASSERT_EQ(values[std::size_t(wte + k)], 0.0f);
  EXPECT_EQ(stddev("final_norm.weight"), 1.0);
  // Same seed, same weights.
  Model again(c, *backend);
  again.initialize(3);
  EXPECT_EQ(again.parameters_to_host(), values);
}

// The normal initialisation is drawn in order and transformed in parallel: the values are
// those of successive Rng::normal() calls, across the chunk edge at 2^20 values too (the
// embedding here holds 4100 × 256 > 2^20 of them) and on any number of cores.
TEST(ModelInit, NormalValuesAreTheSequentialDraws) {
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  const ModelConfig c = rope_model_with_vocabulary(256, 1, 4100, 4160);
  Model model(c, *backend);
  model.initialize(7);
  const auto values = model.parameters_to_host();
  const std::int64_t wte = model.layout().offset(model.layout().index_of("wte.weight"));
  ASSERT_EQ(wte, 0) << "the embedding is the first tensor drawn";
  const std::int64_t n = std::int64_t(c.vocab_size) * c.n_embd;
  ASSERT_GT(n, std::int64_t(1) << 20);
  Rng rng(7);
  for (std::int64_t k = 0; k < n; ++k) {
    const float expected = float(c.init_std * rng.normal());
    ASSERT_EQ(values[std::size_t(wte + k)], expected) << "value " << k;
  }
}

class ModelGradient : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGradient, MatchesFiniteDifferencesInDouble) {
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  const ModelConfig c = tiny_model(GetParam());
  Model model(c, *backend);
  model.initialize(11);
  const int B = 2, T = 7;
  Rng rng(5);
  const auto tokens = random_tokens(rng, B * T, c.vocab_size);
  auto targets = random_tokens(rng, B * T, c.vocab_size);
  targets[3] = -1;  // a masked target contributes nothing

  model.zero_gradients();
  const LossSum loss = model.forward_backward(tokens.data(), targets.data(), B, T, 1.0);
  EXPECT_EQ(loss.count, B * T - 1);
  double* params = model.parameters().as<double>();
  const double* grads = model.gradients().as<double>();

  // Every parameter tensor: up to 12 entries each (all of the small ones).
  std::vector<std::int64_t> picks;
  for (std::size_t i = 0; i < model.layout().specs().size(); ++i) {
    const std::int64_t n = shape_numel(model.layout().specs()[i].shape);
    const std::int64_t stride = std::max<std::int64_t>(1, n / 12);
    for (std::int64_t k = 0; k < n; k += stride) picks.push_back(model.layout().offset(i) + k);
  }
  std::vector<double> values, analytic;
  for (auto p : picks) {
    values.push_back(params[p]);
    analytic.push_back(grads[p]);
  }
  auto total_loss = [&] {
    for (std::size_t k = 0; k < picks.size(); ++k) params[picks[k]] = values[k];
    return model.forward(tokens.data(), targets.data(), B, T).sum;
  };
  // The PJ-bias starts with amplitudes 0.02·N(0, 1), so many of its gradients are 1e−7…1e−4,
  // under the check's 1e−3 floor where the 1e−5 step's rounding noise (~1e−9 on a loss of ~50)
  // would reach 1e−6 relative; a 1e−4 step keeps both rounding and truncation below 1e−7 there.
  const bool small_pj_gradients = model.position().has_score_bias() && !model.position().layer_parameters(2, 4).empty();
  const pope::testing::GradientCheckOptions options{.step = small_pj_gradients ? 1e-4 : 1e-5, .magnitude_floor = 1e-3};
  EXPECT_LT(pope::testing::max_relative_gradient_error(total_loss, values, analytic, options), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Encodings, ModelGradient,
                         ::testing::Values("nope", "rope", "pope", "alibi", "full", "rope_affine", "pj_rotary"),
                         [](const auto& info) { return info.param; });

TEST(ModelForward, MaskedTargetsAndTokenLosses) {
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  const ModelConfig c = tiny_model("pope");
  Model model(c, *backend);
  model.initialize(1);
  Rng rng(2);
  const auto tokens = random_tokens(rng, 8, c.vocab_size);
  auto targets = random_tokens(rng, 8, c.vocab_size);
  std::vector<float> per_token(8);
  const LossSum all = model.forward(tokens.data(), targets.data(), 1, 8, per_token.data());
  EXPECT_EQ(all.count, 8);
  EXPECT_NEAR(std::accumulate(per_token.begin(), per_token.end(), 0.0), all.sum, 1e-5);
  // Uniform-ish predictions at init: loss near log(vocab).
  EXPECT_NEAR(all.mean(), std::log(double(c.vocab_size)), 1.0);
  targets[0] = -1;
  const LossSum masked = model.forward(tokens.data(), targets.data(), 1, 8, per_token.data());
  EXPECT_EQ(masked.count, 7);
  EXPECT_EQ(per_token[0], 0.0f);
  // Causality: changing the last token cannot change earlier losses.
  auto changed = tokens;
  changed[7] = (changed[7] + 1) % c.vocab_size;
  std::vector<float> after(8);
  model.forward(changed.data(), targets.data(), 1, 8, after.data());
  for (int t = 0; t < 7; ++t) EXPECT_EQ(after[std::size_t(t)], per_token[std::size_t(t)]) << t;
}

// forward_backward reports the same per-token losses as forward: on the CPU both passes compute
// the logits in the backend's own precision (only a bf16 backend evaluates in wider logits).
TEST(ModelForward, ForwardBackwardReportsTheForwardsTokenLosses) {
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  const ModelConfig c = tiny_model("rope");
  Model model(c, *backend);
  model.initialize(3);
  Rng rng(4);
  const auto tokens = random_tokens(rng, 16, c.vocab_size);
  auto targets = random_tokens(rng, 16, c.vocab_size);
  targets[3] = -1;
  std::vector<float> forward_losses(16), training_losses(16, -1.0f);
  const LossSum evaluated = model.forward(tokens.data(), targets.data(), 2, 8, forward_losses.data());
  model.zero_gradients();
  const LossSum trained = model.forward_backward(tokens.data(), targets.data(), 2, 8, 1.0 / 15, training_losses.data());
  EXPECT_EQ(trained.sum, evaluated.sum);
  EXPECT_EQ(trained.count, 15);
  EXPECT_EQ(training_losses, forward_losses);
  EXPECT_EQ(training_losses[3], 0.0f);
}

TEST(ModelForward, RejectsTokensOutsideTheVocabulary) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  const ModelConfig c = tiny_model("rope");
  Model model(c, *backend);
  model.initialize(1);
  std::vector<std::int32_t> tokens{1, 2, 29}, targets{2, 3, 4};
  EXPECT_THROW(model.forward(tokens.data(), targets.data(), 1, 3), std::invalid_argument);
}

TEST(ModelForward, FloatAgreesWithDouble) {
  auto f = make_backend(DeviceChoice::cpu, "float", 1);
  auto d = make_backend(DeviceChoice::cpu, "double", 1);
  for (const std::string kind : {"rope", "pope", "alibi", "full", "pj_rotary"}) {
    const ModelConfig c = tiny_model(kind);
    Model mf(c, *f), md(c, *d);
    mf.initialize(4);
    md.parameters_from_host(mf.parameters_to_host());
    Rng rng(9);
    const auto tokens = random_tokens(rng, 16, c.vocab_size);
    const auto targets = random_tokens(rng, 16, c.vocab_size);
    EXPECT_NEAR(mf.forward(tokens.data(), targets.data(), 2, 8).mean(),
                md.forward(tokens.data(), targets.data(), 2, 8).mean(), 1e-4)
        << kind;
  }
}

TEST(ModelRecompute, GradientsAreBitwiseTheSame) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  const ModelConfig c = tiny_model("pope");
  Model stored(c, *backend), recomputed(c, *backend);
  stored.initialize(3);
  recomputed.parameters_from_host(stored.parameters_to_host());
  recomputed.set_activation_recompute(true);
  Rng rng(11);
  const auto tokens = random_tokens(rng, 16, c.vocab_size);
  const auto targets = random_tokens(rng, 16, c.vocab_size);
  std::vector<std::vector<float>> grads;
  for (Model* model : {&stored, &recomputed}) {
    model->zero_gradients();
    const LossSum loss = model->forward_backward(tokens.data(), targets.data(), 2, 8, 1.0 / 16);
    EXPECT_GT(loss.mean(), 0.0);
    grads.push_back(tensor_to_host_f32(*backend, model->gradients()));
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_GT(std::count_if(grads[0].begin(), grads[0].end(), [](float g) { return g != 0.0f; }), 100);
}

// The classifier runs over row chunks (4,096 rows): the per-token losses on both sides of a
// chunk edge are those of the logits of their own rows.
TEST(ModelClassifier, TokenLossesAcrossChunkEdgesMatchTheirRowsLogits) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  const ModelConfig config = tiny_model("rope");
  Model model(config, *backend);
  model.initialize(5);
  const int B = 700, T = config.context_length;  // 5,600 rows: two chunks
  Rng rng(9);
  const auto tokens = random_tokens(rng, B * T, config.vocab_size), targets = random_tokens(rng, B * T, config.vocab_size);
  std::vector<float> losses(std::size_t(B) * T);
  model.forward(tokens.data(), targets.data(), B, T, losses.data());
  const std::vector<std::int64_t> rows{0, 4095, 4096, 4097, B * T - 1};
  const std::vector<float> logits = model.logits_at(tokens.data(), B, T, rows);
  const std::size_t V = std::size_t(config.vocab_size);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const float* row = logits.data() + i * V;
    double peak = *std::max_element(row, row + V), sum = 0.0;
    for (std::size_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - peak);
    const double nll = peak + std::log(sum) - row[std::size_t(targets[std::size_t(rows[i])])];
    EXPECT_NEAR(losses[std::size_t(rows[i])], nll, 1e-4 * std::max(1.0, nll)) << "row " << rows[i];
  }
}
