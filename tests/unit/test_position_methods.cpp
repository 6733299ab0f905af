// The method names of model.position.kind (spec 5.3): what each builds, how a composed
// method splits its parameters and hooks between its parts, the fixed RoPE scalings, and
// that a composed score is relative.
#include <gtest/gtest.h>

#include <cmath>

#include "position/encodings.hpp"
#include "position/registry.hpp"
#include "position_test_support.hpp"

using namespace pope;
using namespace pope::testing;

namespace {

ModelConfig model_with(const std::string& kind) {
  ModelConfig config;
  config.n_head = 4;
  config.n_embd = 256;  // head_dim 64
  config.context_length = 128;
  config.position.kind = kind;
  return config;
}

std::string config_error_path(const ModelConfig& config) {
  try {
    make_position_encoding(config);
  } catch (const ConfigError& e) {
    return e.path();
  }
  return "";
}

}  // namespace

TEST(PositionMethods, EverySpecNameIsKnown) {
  for (const char* name : {"none", "rope", "rope_pi", "rope_ntk", "rope_yarn", "rope_ntk_affine", "rope_yarn_affine",
                           "pj_rotary", "affine", "fj_affine", "fj_lc", "rope_affine", "full", "lc_affine", "pjrope",
                           "nope", "pope", "alibi"})
    EXPECT_NE(find_position_method(name), nullptr) << name;
  EXPECT_TRUE(find_position_method("pjrope")->alias);
  EXPECT_TRUE(find_position_method("none")->alias);
  const auto pjrope = make_position_encoding(model_with("pjrope"));
  const auto full = make_position_encoding(model_with("full"));
  const BiasPlan a = pjrope->bias_plan(make_context(8, 64, 4)), b = full->bias_plan(make_context(8, 64, 4));
  EXPECT_EQ(a.pj.sectors, b.pj.sectors);
  EXPECT_EQ(find_position_method("sinusoidal"), nullptr);
}

TEST(PositionMethods, EachMethodComposesTheRightParts) {
  struct Expected {
    const char* kind;
    bool transforms;
    bool bias;
    std::size_t params;
  };
  for (const Expected& e : {Expected{"none", false, false, 0}, Expected{"rope_pi", true, false, 0},
                            Expected{"pj_rotary", true, false, 0}, Expected{"affine", false, true, kPjParamCount},
                            Expected{"full", false, true, kPjParamCount},
                            Expected{"rope_ntk_affine", true, true, kPjParamCount},
                            Expected{"fj_lc", false, true, kPjParamCount}}) {
    const auto encoding = make_position_encoding(model_with(e.kind));
    EXPECT_EQ(encoding->transforms_qk(), e.transforms) << e.kind;
    EXPECT_EQ(encoding->has_score_bias(), e.bias) << e.kind;
    EXPECT_EQ(encoding->layer_parameters(4, 64).size(), e.params) << e.kind;
  }
  const auto full = make_position_encoding(model_with("pjrope"));
  const auto* composed = dynamic_cast<const ComposedEncoding*>(full.get());
  ASSERT_NE(composed, nullptr);
  const auto& bias = dynamic_cast<const PjBiasEncoding&>(composed->bias_part());
  EXPECT_EQ(bias.sectors(), (PjSectorMask{true, true, true}));
  EXPECT_EQ(bias.order(), 3);
  EXPECT_EQ(bias.rho(), PjRho::linear);
  EXPECT_EQ(bias.train_length(), 128);
  EXPECT_NE(dynamic_cast<const NopeEncoding*>(&composed->transform_part()), nullptr);
}

TEST(PositionMethods, RopeMethodsFixTheirScaling) {
  ModelConfig config = model_with("rope_pi");
  config.position.rope.scaling.factor = 4.0;
  const auto pi = make_position_encoding(config);
  const auto& rope = dynamic_cast<const RopeEncoding&>(*pi);
  EXPECT_NEAR(rope.frequencies(make_context(8, 64))[0], 0.25, 1e-15);  // θ_0 / s

  config.position.kind = "rope_yarn_affine";
  const auto yarn = make_position_encoding(config);
  EXPECT_NEAR(yarn->softmax_scale(make_context(8, 64)), std::pow(0.1 * std::log(4.0) + 1.0, 2) / 8.0, 1e-15);

  config.position.kind = "rope_ntk";
  config.position.rope.scaling.kind = RopeScalingKind::yarn;  // contradicts the name
  EXPECT_EQ(config_error_path(config), "model.position.rope.scaling.kind");
  config.position.rope.scaling.kind = RopeScalingKind::ntk;  // agrees: fine
  EXPECT_EQ(config_error_path(config), "");
}

TEST(PositionMethods, BadPjOptionsNameTheirKey) {
  ModelConfig config = model_with("pj_rotary");
  config.position.pj.rotary_order = 2;  // blocks of 6 do not divide 64
  EXPECT_EQ(config_error_path(config), "model.position.pj.rotary_order");
  config = model_with("full");
  config = model_with("nonsense");
  EXPECT_EQ(config_error_path(config), "model.position.kind");
}

TEST(PositionMethods, ComposedParametersAreTheTransformsThenTheBiass) {
  // PoPE's δ + a PJ-bias: not a spec method, but the composition must keep both parts'
  // parameters apart. Hooks get their own slices.
  PjConfig pj;
  pj.order = 1;
  auto composed = ComposedEncoding("pope_full", std::make_unique<PopeEncoding>(PopeConfig{}),
                                   std::make_unique<PjBiasEncoding>(pj, PjSectorMask{true, true, true}, 16));
  const auto specs = composed.layer_parameters(2, 4);
  ASSERT_EQ(specs.size(), 1 + kPjParamCount);
  EXPECT_EQ(specs[0].name, "delta");
  EXPECT_EQ(specs[1].name, "omega");
  EXPECT_EQ(composed.transform_parameter_count(2, 4), 1u);
  EXPECT_EQ(composed.qk_width(4), 8);

  // The composed bias equals the bias part's with its slice of the parameters.
  std::vector<std::vector<double>> params;
  for (std::size_t i = 0; i < specs.size(); ++i)
    params.push_back(random_values(static_cast<std::size_t>(shape_numel(specs[i].shape)), -1, 1, unsigned(i)));
  const PositionContext ctx = make_context(10, 4, 2, 0, 16);
  std::vector<double> table(10), part_table(10);
  const std::vector<const double*> pointers = value_pointers(params);
  composed.score_bias(ctx, 1, pointers, table.data());
  composed.bias_part().score_bias(ctx, 1, std::span<const double* const>(pointers).subspan(1), part_table.data());
  EXPECT_EQ(table, part_table);

  // Transform gradients (δ) flow to the first slot only; FD through the composed hooks.
  std::vector<double> x = random_values(3 * 4, -1, 1, 5);
  EXPECT_LT(transform_gradient_error(composed, make_context(3, 4, 2, 7, 16), 1, true, x, 4, params), 1e-8);

  // Custom init reaches the right part: index 1 is the bias's ω.
  std::vector<double> omega(2);
  composed.initialize_custom(1, omega, 2, 4);
  EXPECT_NEAR(omega[1], 2.0 * 3.141592653589793 * 17.0 / 16.0, 1e-12);
}

TEST(PositionMethods, RopeAffineScoreIsRelative) {
  const auto encoding = make_position_encoding(model_with("rope_affine"));
  const auto specs = encoding->layer_parameters(4, 64);
  std::vector<std::vector<double>> params;
  for (std::size_t i = 0; i < specs.size(); ++i)
    params.push_back(random_values(static_cast<std::size_t>(shape_numel(specs[i].shape)), -1, 1, unsigned(i)));
  const std::vector<double> q = random_values(64, -1, 1, 1), k = random_values(64, -1, 1, 2);
  // Full score: <q̃_t, k̃_s>·scale + b(t − s), with the bias table of a call covering t.
  const auto score = [&](int t, int s) {
    PositionContext ctx = make_context(t + 1, 64, 4, 0, 128);
    std::vector<double> table(static_cast<std::size_t>(t + 1));
    encoding->score_bias(ctx, 2, value_pointers(params), table.data());
    return transformed_score(*encoding, ctx, 2, q, t, k, s, params) * encoding->softmax_scale(ctx) + table[t - s];
  };
  for (auto [t, s] : {std::pair{10, 3}, std::pair{60, 59}, std::pair{5, 5}})
    EXPECT_NEAR(score(t, s), score(t + 37, s + 37), 1e-12) << t << ", " << s;
}
