// PJ-bias diagnostics on a tiny model: gates, order mass and top order against values
// worked out here from the parameters, energies for a head with a single order, the
// leave-one-out ablations through an NLL evaluator, and the JSON file.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pope/backend.hpp"
#include "pope/model.hpp"
#include "pope/pj_diagnostics.hpp"
#include "pope/rng.hpp"
#include "scratch_dir.hpp"
#include "model_shape.hpp"

using namespace pope;

namespace {

ModelConfig tiny_model(const std::string& kind) {
  pope::testing::ModelShape shape = pope::testing::kTinyShape;
  shape.context_length = 16;
  ModelConfig c = pope::testing::model_config(shape, kind);
  c.init_std = 0.3;
  c.position.pj.order = 2;
  return c;
}

struct TinyModel {
  std::unique_ptr<Backend> backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model;
  std::vector<float> params;
  explicit TinyModel(const ModelConfig& c) : model(c, *backend) {
    model.initialize(3);
    params = model.parameters_to_host();
  }
  float& entry(std::vector<float>& values, const std::string& name, std::int64_t k) {
    return values[std::size_t(model.layout().offset(model.layout().index_of(name)) + k)];
  }
  float& at(const std::string& name, std::int64_t k = 0) { return entry(params, name, k); }
  // Mean NLL on fixed random tokens, with the given parameters.
  double nll(std::span<const float> values) {
    model.parameters_from_host(values);
    Rng rng(9);
    std::vector<std::int32_t> tokens(2 * 16), targets(2 * 16);
    for (auto& t : tokens) t = std::int32_t(rng.below(29));
    for (auto& t : targets) t = std::int32_t(rng.below(29));
    return model.forward(tokens.data(), targets.data(), 2, 16).mean();
  }
};

}  // namespace

TEST(PjDiagnostics, GatesMassAndTopOrderFollowTheParameters) {
  TinyModel tiny(tiny_model("full"));
  // Layer 1, head 1: uniform gates, order weights softmax(0, ln 2, 0) = (¼, ½, ¼),
  // ζ = (3 + 4i, 0, 1), ζ' = (0, 2i, 0).
  for (int k = 0; k < 3; ++k) tiny.at("layers.1.position.gate_logits", 3 + k) = 0.0f;
  const float order_logits[3] = {0.0f, float(std::log(2.0)), 0.0f};
  const float fj_re[3] = {3, 0, 1}, fj_im[3] = {4, 0, 0}, lc_re[3] = {0, 0, 0}, lc_im[3] = {0, 2, 0};
  for (int r = 0; r < 3; ++r) {
    tiny.at("layers.1.position.fj_order_logits", 3 + r) = order_logits[r];
    tiny.at("layers.1.position.lc_order_logits", 3 + r) = order_logits[r];
    tiny.at("layers.1.position.fj_re", 3 + r) = fj_re[r];
    tiny.at("layers.1.position.fj_im", 3 + r) = fj_im[r];
    tiny.at("layers.1.position.lc_re", 3 + r) = lc_re[r];
    tiny.at("layers.1.position.lc_im", 3 + r) = lc_im[r];
  }
  tiny.at("layers.1.position.affine_slope", 1) = 0.0f;  // s = ln 2

  const PjDiagnostics report = compute_pj_diagnostics(tiny.model.config(), tiny.model.layout(), tiny.params, 16);
  ASSERT_EQ(report.layers.size(), 2u);
  const PjHeadDiagnostics& head = report.layers[1].heads[1];
  for (double g : head.gates) EXPECT_NEAR(g, 1.0 / 3.0, 1e-7);
  // m_r = g_FJ α_r |ζ_r| + g_LC α'_r |ζ'_r| = (⅓·¼·5, ⅓·½·2, ⅓·¼·1).
  const double mass[3] = {5.0 / 12.0, 1.0 / 3.0, 1.0 / 12.0};
  for (int r = 0; r < 3; ++r) {
    EXPECT_NEAR(head.order_mass[r], mass[r], 1e-6);
    EXPECT_NEAR(head.order_mass_normalised[r], mass[r] / (5.0 / 6.0), 1e-6);
  }
  EXPECT_EQ(head.top_order, 0);
  EXPECT_NEAR(head.affine_mass, std::log(2.0) / 3.0, 1e-7);
  EXPECT_NEAR(head.affine_slope, std::log(2.0) / 3.0 / 16.0, 1e-8);
  ASSERT_EQ(head.energy.size(), 3u);
  // Means: layer mean over its two heads, overall mean over four.
  const auto& layer = report.layers[1];
  EXPECT_NEAR(layer.mean.gates[0], (layer.heads[0].gates[0] + layer.heads[1].gates[0]) / 2, 1e-12);
  double overall = 0.0;
  for (const auto& l : report.layers)
    for (const auto& h : l.heads) overall += h.affine_mass / 4;
  EXPECT_NEAR(report.mean.affine_mass, overall, 1e-12);
}

TEST(PjDiagnostics, EnergyOfASingleOrderIsOne) {
  TinyModel tiny(tiny_model("fj_affine"));
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 3; ++r) {
      tiny.at("layers.0.position.fj_re", h * 3 + r) = r == 1 ? 0.5f : 0.0f;
      tiny.at("layers.0.position.fj_im", h * 3 + r) = r == 1 ? -0.2f : 0.0f;
    }
  const PjDiagnostics report = compute_pj_diagnostics(tiny.model.config(), tiny.model.layout(), tiny.params, 40);
  for (const auto& head : report.layers[0].heads) {
    EXPECT_NEAR(head.energy[1], 1.0, 1e-9);
    EXPECT_EQ(head.energy[0], 0.0);
    EXPECT_EQ(head.energy[2], 0.0);
    EXPECT_EQ(head.top_order, 1);
    EXPECT_EQ(head.gates[2], 0.0);  // LC disabled in fj_affine
  }
}

TEST(PjDiagnostics, AblationsEvaluateTheEditedModels) {
  TinyModel tiny(tiny_model("full"));
  // Larger FJ amplitudes than the init's 0.02: ablations then change the NLL visibly.
  for (int l = 0; l < 2; ++l)
    for (int k = 0; k < 6; ++k) tiny.at(fmt::format("layers.{}.position.fj_re", l), k) = 1.5f;
  PjDiagnostics report = compute_pj_diagnostics(tiny.model.config(), tiny.model.layout(), tiny.params, 16);
  int calls = 0;
  const auto evaluate = [&](std::span<const float> values) {
    ++calls;
    return tiny.nll(values);
  };
  add_pj_ablations(report, tiny.model.config(), tiny.model.layout(), tiny.params, evaluate);
  ASSERT_TRUE(report.ablations);
  EXPECT_EQ(calls, 1 + 3 + 3);
  EXPECT_DOUBLE_EQ(report.ablations->nll, tiny.nll(tiny.params));

  // Order 1 removed by hand: the same ΔNLL.
  auto edited = tiny.params;
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"fj_re", "fj_im", "lc_re", "lc_im"})
      for (int h = 0; h < 2; ++h) tiny.entry(edited, fmt::format("layers.{}.position.{}", l, p), h * 3 + 1) = 0.0f;
  EXPECT_DOUBLE_EQ(report.ablations->order_delta_nll[1], tiny.nll(edited) - report.ablations->nll);
  EXPECT_NE(report.ablations->order_delta_nll[1], 0.0);
  for (const auto& delta : report.ablations->sector_delta_nll) {
    ASSERT_TRUE(delta.has_value());
    EXPECT_NE(*delta, 0.0);
  }
}

TEST(PjDiagnostics, AffineOnlyHasNoSectorAblationAndNoOrderEffect) {
  TinyModel tiny(tiny_model("rope_affine"));
  PjDiagnostics report = compute_pj_diagnostics(tiny.model.config(), tiny.model.layout(), tiny.params, 16);
  add_pj_ablations(report, tiny.model.config(), tiny.model.layout(), tiny.params,
                   [&](std::span<const float> values) { return tiny.nll(values); });
  for (double delta : report.ablations->order_delta_nll) EXPECT_EQ(delta, 0.0);
  for (const auto& delta : report.ablations->sector_delta_nll) EXPECT_FALSE(delta.has_value());
  EXPECT_EQ(report.mean.gates[1], 1.0);
}

TEST(PjDiagnostics, JsonStatesTheGridAndIsWrittenAtomically) {
  TinyModel tiny(tiny_model("pjrope"));
  const PjDiagnostics report = compute_pj_diagnostics(tiny.model.config(), tiny.model.layout(), tiny.params, 64);
  pope::testing::ScratchDir dir;
  write_pj_diagnostics(dir.path() / "diagnostics.json", report);
  std::ifstream in(dir.path() / "diagnostics.json");
  const nlohmann::json json = nlohmann::json::parse(in);
  EXPECT_EQ(json["energy_grid"]["last_lag"], 63);
  EXPECT_EQ(json["order"], 2);
  EXPECT_EQ(json["layers"].size(), 2u);
  EXPECT_EQ(json["layers"][0]["heads"][1]["energy"].size(), 3u);
  EXPECT_FALSE(json.contains("ablations"));
  EXPECT_NE(format_pj_diagnostics(report).find("all mean"), std::string::npos);
  EXPECT_THROW(write_pj_diagnostics(dir.path() / "missing" / "x.json", report), std::runtime_error);
}

TEST(PjDiagnostics, RejectsModelsWithoutAPjBiasAndBadArguments) {
  TinyModel rope(tiny_model("rope"));
  EXPECT_THROW(compute_pj_diagnostics(rope.model.config(), rope.model.layout(), rope.params, 16), std::invalid_argument);
  TinyModel full(tiny_model("full"));
  EXPECT_THROW(compute_pj_diagnostics(full.model.config(), full.model.layout(), full.params, 0), std::invalid_argument);
  const std::vector<float> short_params(10);
  EXPECT_THROW(compute_pj_diagnostics(full.model.config(), full.model.layout(), short_params, 16),
               std::invalid_argument);
}
