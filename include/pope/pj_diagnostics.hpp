// Diagnostics of a trained PJ-bias (docs/encodings.md, section 5.4), per layer
// and head, with means over heads (per layer and over the whole model):
//   - sector gates (g_FJ, g_A, g_LC);
//   - effective mass per order m_r = g_FJ·α_r·|ζ_r| + g_LC·α'_r·|ζ'_r|, its normalised form
//     m̄_r = max(0, m_r)/Σ and the top order argmax_r m̄_r;
//   - affine mass g_A·s_h and slope g_A·s_h/L (the bias's decrease per token of lag near 0);
//   - functional energy E_r = ‖C_r‖₂/(‖Σ_k C_k‖₂ + 1e−12) of the gated order-r terms C_r of
//     FJ + LC on the lag grid Δ = 0, 1, …, eval_length − 1 (stated in the report);
//   - optionally leave-one-order-out and leave-one-sector-out ΔNLL through a caller-given
//     evaluator (ablations are expressed as parameter edits, so any backend can run them).
#pragma once

#include <array>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pope/config.hpp"
#include "pope/tensor.hpp"

namespace pope {

struct PjHeadDiagnostics {
  std::array<double, 3> gates{};               // FJ, affine, LC
  std::vector<double> order_mass;              // m_r, r = 0..K
  std::vector<double> order_mass_normalised;   // m̄_r
  int top_order = 0;                           // argmax_r m̄_r
  double affine_mass = 0.0;                    // g_A·s_h
  double affine_slope = 0.0;                   // g_A·s_h / L
  std::vector<double> energy;                  // E_r
};

struct PjLayerDiagnostics {
  std::vector<PjHeadDiagnostics> heads;
  PjHeadDiagnostics mean;  // means over heads; top_order of the mean mass
};

struct PjAblations {
  double nll = 0.0;                                  // NLL of the unmodified model
  std::vector<double> order_delta_nll;               // ΔNLL_r, order r's amplitudes zeroed everywhere
  std::array<std::optional<double>, 3> sector_delta_nll;  // no value: sector disabled, or the only one
};

struct PjDiagnostics {
  std::string kind;        // model.position.kind
  int order = 0;           // K
  std::string rho;         // linear | lightcone
  std::array<bool, 3> sectors{};
  int train_length = 0;    // L
  int eval_length = 0;     // energy grid Δ = 0..eval_length − 1
  std::vector<PjLayerDiagnostics> layers;
  PjHeadDiagnostics mean;  // over every head of every layer
  std::optional<PjAblations> ablations;
};

// The report for the model described by `config` with host parameters `parameters` laid
// out by `layout` (Model::layout(), Model::parameters_to_host() or a loaded checkpoint).
// Throws std::invalid_argument if model.position.kind has no PJ-bias, if the parameters do
// not match the layout, or if eval_length < 1.
PjDiagnostics compute_pj_diagnostics(const ModelConfig& config, const ParameterLayout& layout,
                                     std::span<const float> parameters, int eval_length);

// NLL (mean per token) of the model with the given parameters (same layout) on the caller's
// validation data.
using PjNllEvaluator = std::function<double(std::span<const float> parameters)>;

// Fills report.ablations: the unmodified NLL, then for each order r the NLL with u_r, v_r,
// u'_r, v'_r = 0 in every head and layer, and for each enabled sector (when another is
// enabled) the NLL with its gate logit at −10^30 (gate 0, the others renormalised).
void add_pj_ablations(PjDiagnostics& report, const ModelConfig& config, const ParameterLayout& layout,
                      std::span<const float> parameters, const PjNllEvaluator& evaluate_nll);

nlohmann::json pj_diagnostics_to_json(const PjDiagnostics& report);
// A human-readable summary (one line per layer and head, then the means and ablations).
std::string format_pj_diagnostics(const PjDiagnostics& report);
// Writes the JSON atomically; throws std::runtime_error naming the file on failure.
void write_pj_diagnostics(const std::filesystem::path& path, const PjDiagnostics& report);

}  // namespace pope
