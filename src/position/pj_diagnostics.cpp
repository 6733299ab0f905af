// PJ-bias diagnostics (see pope/pj_diagnostics.hpp). Everything is read from the same
// pj_bias_math the encoding evaluates, so the report describes exactly the trained bias.
#include "pope/pj_diagnostics.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/atomic_file.hpp"
#include "position/encodings.hpp"
#include "position/pj_bias_math.hpp"

namespace pope {

namespace {

constexpr double kEnergyEpsilon = 1e-12;
// A gate logit this low gives its sector gate exactly 0 in the softmax (e^−10^30 underflows)
// while the other sectors renormalise.
constexpr float kDisabledGateLogit = -1e30f;
const char* const kSectorNames[3] = {"fourier_jet", "affine", "light_cone"};

// The model's PJ-bias, or an error saying the kind has none.
struct PjModel {
  std::unique_ptr<PositionEncoding> encoding;
  const PjBiasEncoding* bias = nullptr;
};

PjModel pj_model(const ModelConfig& config) {
  PjModel model{make_position_encoding(config)};
  if (const auto* composed = dynamic_cast<const ComposedEncoding*>(model.encoding.get()))
    model.bias = dynamic_cast<const PjBiasEncoding*>(&composed->bias_part());
  if (model.bias == nullptr)
    throw std::invalid_argument("PJ diagnostics: model.position.kind '" + config.position.kind +
                                "' has no PJ-bias (expected one of the *_affine kinds, fj_lc, full or pjrope)");
  return model;
}

// Offsets of layer `layer`'s PJ-bias parameters in the flat parameter vector, PjParam order.
std::vector<std::int64_t> pj_offsets(const PjBiasEncoding& bias, const ModelConfig& config,
                                     const ParameterLayout& layout, int layer) {
  std::vector<std::int64_t> offsets;
  for (const ParamSpec& spec : bias.layer_parameters(config.n_head, config.head_dim())) {
    const std::string name = fmt::format("layers.{}.position.{}", layer, spec.name);
    if (!layout.contains(name)) throw std::invalid_argument("PJ diagnostics: the parameters have no '" + name + "'");
    offsets.push_back(layout.offset(layout.index_of(name)));
  }
  return offsets;
}

std::vector<const float*> pointers_at(std::span<const float> parameters, const std::vector<std::int64_t>& offsets) {
  std::vector<const float*> pointers;
  for (std::int64_t offset : offsets) pointers.push_back(parameters.data() + offset);
  return pointers;
}

PjHeadDiagnostics head_diagnostics(const PjBiasEncoding& bias, const PjHead& head, int eval_length) {
  const int orders = head.order + 1;
  PjHeadDiagnostics d;
  d.gates = head.gate;
  d.affine_mass = head.gate[kPjAffine] * head.slope;
  d.affine_slope = d.affine_mass / bias.train_length();
  double total = 0.0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(orders); ++r) {
    const double mass = head.gate[kPjFourierJet] * head.fj_alpha[r] * std::hypot(head.fj_re[r], head.fj_im[r]) +
                        head.gate[kPjLightCone] * head.lc_alpha[r] * std::hypot(head.lc_re[r], head.lc_im[r]);
    d.order_mass.push_back(mass);
    total += std::max(0.0, mass);
  }
  for (double mass : d.order_mass) d.order_mass_normalised.push_back(total > 0.0 ? std::max(0.0, mass) / total : 0.0);
  d.top_order = static_cast<int>(std::max_element(d.order_mass_normalised.begin(), d.order_mass_normalised.end()) -
                                 d.order_mass_normalised.begin());

  std::vector<double> order_norm(static_cast<std::size_t>(orders), 0.0);
  double sum_norm = 0.0;
  for (int lag = 0; lag < eval_length; ++lag) {
    const PjLag terms = evaluate_pj_lag(head, lag, bias.train_length(), bias.rho(), bias.sectors());
    double sum = 0.0;
    for (int r = 0; r < orders; ++r) {
      const double term = pj_order_term(head, terms, r);
      order_norm[static_cast<std::size_t>(r)] += term * term;
      sum += term;
    }
    sum_norm += sum * sum;
  }
  for (double norm : order_norm) d.energy.push_back(std::sqrt(norm) / (std::sqrt(sum_norm) + kEnergyEpsilon));
  return d;
}

// Element-wise mean of heads; the top order is that of the mean normalised mass.
PjHeadDiagnostics mean_of(const std::vector<const PjHeadDiagnostics*>& heads) {
  PjHeadDiagnostics mean = *heads.front();
  const auto average = [&](auto member) {
    auto& out = mean.*member;
    for (std::size_t i = 0; i < out.size(); ++i) {
      double sum = 0.0;
      for (const auto* h : heads) sum += ((*h).*member)[i];
      out[i] = sum / static_cast<double>(heads.size());
    }
  };
  average(&PjHeadDiagnostics::order_mass);
  average(&PjHeadDiagnostics::order_mass_normalised);
  average(&PjHeadDiagnostics::energy);
  for (std::size_t k = 0; k < mean.gates.size(); ++k) {
    double sum = 0.0;
    for (const auto* h : heads) sum += h->gates[k];
    mean.gates[k] = sum / static_cast<double>(heads.size());
  }
  double mass = 0.0, slope = 0.0;
  for (const auto* h : heads) {
    mass += h->affine_mass;
    slope += h->affine_slope;
  }
  mean.affine_mass = mass / static_cast<double>(heads.size());
  mean.affine_slope = slope / static_cast<double>(heads.size());
  mean.top_order = static_cast<int>(std::max_element(mean.order_mass_normalised.begin(),
                                                     mean.order_mass_normalised.end()) -
                                    mean.order_mass_normalised.begin());
  return mean;
}

void check_parameters(const ParameterLayout& layout, std::span<const float> parameters) {
  if (static_cast<std::int64_t>(parameters.size()) != layout.total_numel())
    throw std::invalid_argument(fmt::format("PJ diagnostics: got {} parameters, the model's layout has {}",
                                            parameters.size(), layout.total_numel()));
}

nlohmann::json head_json(const PjHeadDiagnostics& d) {
  return {{"gates", {{"fourier_jet", d.gates[0]}, {"affine", d.gates[1]}, {"light_cone", d.gates[2]}}},
          {"order_mass", d.order_mass},
          {"order_mass_normalised", d.order_mass_normalised},
          {"top_order", d.top_order},
          {"affine_mass", d.affine_mass},
          {"affine_slope", d.affine_slope},
          {"energy", d.energy}};
}

std::string head_line(const std::string& label, const PjHeadDiagnostics& d) {
  return fmt::format("{:<10} gates FJ {:.4f} A {:.4f} LC {:.4f} | mass {:.3f} top {} | affine mass {:.4f} slope {:.3e} "
                     "| energy {:.3f}\n",
                     label, d.gates[0], d.gates[1], d.gates[2], fmt::join(d.order_mass_normalised, " "), d.top_order,
                     d.affine_mass, d.affine_slope, fmt::join(d.energy, " "));
}

}  // namespace

PjDiagnostics compute_pj_diagnostics(const ModelConfig& config, const ParameterLayout& layout,
                                     std::span<const float> parameters, int eval_length) {
  if (eval_length < 1)
    throw std::invalid_argument("PJ diagnostics: eval_length must be at least 1, got " + std::to_string(eval_length));
  check_parameters(layout, parameters);
  const PjModel model = pj_model(config);
  const PjBiasEncoding& bias = *model.bias;

  PjDiagnostics report;
  report.kind = config.position.kind;
  report.order = bias.order();
  report.rho = std::string(name_of(bias.rho()));
  report.sectors = bias.sectors();
  report.train_length = bias.train_length();
  report.eval_length = eval_length;
  std::vector<const PjHeadDiagnostics*> all_heads;
  for (int l = 0; l < config.n_layer; ++l) {
    const std::vector<const float*> pointers = pointers_at(parameters, pj_offsets(bias, config, layout, l));
    PjLayerDiagnostics layer;
    for (int h = 0; h < config.n_head; ++h) {
      const PjHead head = resolve_pj_head<float>(pointers, h, bias.order(), bias.sectors());
      layer.heads.push_back(head_diagnostics(bias, head, eval_length));
    }
    std::vector<const PjHeadDiagnostics*> heads;
    for (const auto& h : layer.heads) heads.push_back(&h);
    layer.mean = mean_of(heads);
    report.layers.push_back(std::move(layer));
  }
  for (const auto& layer : report.layers)
    for (const auto& h : layer.heads) all_heads.push_back(&h);
  report.mean = mean_of(all_heads);
  return report;
}

void add_pj_ablations(PjDiagnostics& report, const ModelConfig& config, const ParameterLayout& layout,
                      std::span<const float> parameters, const PjNllEvaluator& evaluate_nll) {
  check_parameters(layout, parameters);
  const PjModel model = pj_model(config);
  const PjBiasEncoding& bias = *model.bias;
  const int orders = bias.order() + 1;
  std::vector<std::vector<std::int64_t>> offsets;
  for (int l = 0; l < config.n_layer; ++l) offsets.push_back(pj_offsets(bias, config, layout, l));

  PjAblations ablations;
  ablations.nll = evaluate_nll(parameters);
  std::vector<float> edited(parameters.begin(), parameters.end());
  for (int r = 0; r < orders; ++r) {
    std::copy(parameters.begin(), parameters.end(), edited.begin());
    for (const auto& layer : offsets)
      for (PjParam amplitude : {kPjFjRe, kPjFjIm, kPjLcRe, kPjLcIm})
        for (int h = 0; h < config.n_head; ++h) edited[std::size_t(layer[amplitude] + h * orders + r)] = 0.0f;
    ablations.order_delta_nll.push_back(evaluate_nll(edited) - ablations.nll);
  }
  const int enabled = static_cast<int>(std::count(bias.sectors().begin(), bias.sectors().end(), true));
  for (int k = 0; k < kPjSectorCount; ++k) {
    if (!bias.sectors()[static_cast<std::size_t>(k)] || enabled < 2) continue;
    std::copy(parameters.begin(), parameters.end(), edited.begin());
    for (const auto& layer : offsets)
      for (int h = 0; h < config.n_head; ++h)
        edited[std::size_t(layer[kPjGateLogits] + h * kPjSectorCount + k)] = kDisabledGateLogit;
    ablations.sector_delta_nll[static_cast<std::size_t>(k)] = evaluate_nll(edited) - ablations.nll;
  }
  report.ablations = std::move(ablations);
}

nlohmann::json pj_diagnostics_to_json(const PjDiagnostics& report) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& layer : report.layers) {
    nlohmann::json heads = nlohmann::json::array();
    for (const auto& h : layer.heads) heads.push_back(head_json(h));
    layers.push_back({{"heads", heads}, {"mean", head_json(layer.mean)}});
  }
  nlohmann::json json = {
      {"kind", report.kind},
      {"order", report.order},
      {"rho", report.rho},
      {"sectors", {{"fourier_jet", report.sectors[0]}, {"affine", report.sectors[1]}, {"light_cone", report.sectors[2]}}},
      {"train_length", report.train_length},
      {"energy_grid", {{"first_lag", 0}, {"last_lag", report.eval_length - 1}, {"step", 1}}},
      {"layers", layers},
      {"mean", head_json(report.mean)},
  };
  if (report.ablations) {
    nlohmann::json sectors = nlohmann::json::object();
    for (std::size_t k = 0; k < 3; ++k) {
      const auto& delta = report.ablations->sector_delta_nll[k];
      sectors[kSectorNames[k]] = delta ? nlohmann::json(*delta) : nlohmann::json(nullptr);
    }
    json["ablations"] = {{"nll", report.ablations->nll},
                         {"leave_one_order_out_delta_nll", report.ablations->order_delta_nll},
                         {"leave_one_sector_out_delta_nll", sectors}};
  }
  return json;
}

std::string format_pj_diagnostics(const PjDiagnostics& report) {
  std::string text = fmt::format(
      "PJ-bias diagnostics: kind {}, K = {}, rho {}, L = {}; energies on lags 0..{}\n"
      "(mass = normalised effective mass per order r = 0..K; energy = E_r per order)\n",
      report.kind, report.order, report.rho, report.train_length, report.eval_length - 1);
  for (std::size_t l = 0; l < report.layers.size(); ++l) {
    const auto& layer = report.layers[l];
    for (std::size_t h = 0; h < layer.heads.size(); ++h) text += head_line(fmt::format("L{} H{}", l, h), layer.heads[h]);
    text += head_line(fmt::format("L{} mean", l), layer.mean);
  }
  text += head_line("all mean", report.mean);
  if (report.ablations) {
    text += fmt::format("NLL {:.5f}; leave-one-order-out dNLL: {:.5f}\n", report.ablations->nll,
                        fmt::join(report.ablations->order_delta_nll, " "));
    for (std::size_t k = 0; k < 3; ++k) {
      const auto& delta = report.ablations->sector_delta_nll[k];
      text += fmt::format("leave-sector-out {}: {}\n", kSectorNames[k],
                          delta ? fmt::format("{:.5f}", *delta) : std::string("n/a (disabled or the only sector)"));
    }
  }
  return text;
}

void write_pj_diagnostics(const std::filesystem::path& path, const PjDiagnostics& report) {
  const std::string text = pj_diagnostics_to_json(report).dump(2) + "\n";
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()), text.size());
  try {
    write_bytes_atomic(path, std::span(&bytes, 1));
  } catch (const AtomicWriteError& e) {
    throw std::runtime_error("cannot write PJ diagnostics to " + path.string() + ": " + e.what());
  }
}

}  // namespace pope
