// The built-in rows of the position-method registry and make_position_encoding. A method is
// a q/k transform (none, RoPE with a fixed or configured scaling, PoPE, PJ-rotary), ALiBi, or
// one of those composed with a PJ-bias with some of its sectors enabled (spec 5.3).
// Encodings in files of their own register through PositionMethodRegistration instead.
#include <cmath>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "position/encodings.hpp"
#include "position/registry.hpp"
#include "position/rope_frequencies.hpp"

namespace pope {

namespace {

// RoPE with the method's fixed scaling, if it has one (`fixed` empty: the configured one). A
// different scaling configured in model.position.rope.scaling.kind contradicts the name.
std::unique_ptr<PositionEncoding> make_rope(const ModelConfig& config, std::string_view kind,
                                            RopeScalingKind fixed) {
  RopeConfig rope = config.position.rope;
  if (fixed != RopeScalingKind::none) {
    if (rope.scaling.kind != RopeScalingKind::none && rope.scaling.kind != fixed)
      throw ConfigError("model.position.rope.scaling.kind",
                        fmt::format("kind '{}' uses the scaling '{}'; expected none or {}, found '{}'", kind,
                                    name_of(fixed), name_of(fixed), name_of(rope.scaling.kind)));
    rope.scaling.kind = fixed;
  }
  // The rotating channels are split into two halves (NeoX pairing): an even whole number.
  const double rotating = rope.fraction * config.head_dim();
  if (std::abs(rotating - std::round(rotating)) > 1e-9 || std::lround(rotating) % 2 != 0)
    throw ConfigError("model.position.rope.fraction",
                      fmt::format("expected fraction × head dim ({}) to be an even whole number of channels, found {}",
                                  config.head_dim(), rotating));
  rope_rotary_dim(rope.fraction, config.head_dim());
  return std::make_unique<RopeEncoding>(rope);
}

std::unique_ptr<PositionEncoding> make_pj_rotary(const ModelConfig& config) {
  auto rotary = std::make_unique<PjRotaryEncoding>(config.position.pj);
  const int block_width = 2 * (config.position.pj.rotary_order + 1);
  if (config.head_dim() % block_width != 0)
    throw ConfigError("model.position.pj.rotary_order",
                      fmt::format("expected blocks of 2(rotary_order + 1) = {} dims to divide the head dim {}",
                                  block_width, config.head_dim()));
  return rotary;
}

std::unique_ptr<PositionEncoding> make_alibi(const ModelConfig& config) {
  const double heads = config.position.alibi.head_fraction * config.n_head;
  if (std::abs(heads - std::round(heads)) > 1e-9)
    throw ConfigError("model.position.alibi.head_fraction",
                      fmt::format("expected head_fraction × model.n_head ({}) to be a whole number of heads, found {}",
                                  config.n_head, heads));
  return std::make_unique<AlibiEncoding>(config.position.alibi);
}

// The method `Name` made of `transform` plus a PJ-bias with `Sectors`.
template <PjSectorMask Sectors>
std::unique_ptr<PositionEncoding> with_pj_bias(std::string_view name, std::unique_ptr<PositionEncoding> transform,
                                               const ModelConfig& config) {
  auto bias = std::make_unique<PjBiasEncoding>(config.position.pj, Sectors, config.context_length);
  return std::make_unique<ComposedEncoding>(std::string(name), std::move(transform), std::move(bias));
}

constexpr PjSectorMask kAffine{false, true, false};
constexpr PjSectorMask kFjAffine{true, true, false};
constexpr PjSectorMask kFjLc{true, false, true};
constexpr PjSectorMask kLcAffine{false, true, true};
constexpr PjSectorMask kAll{true, true, true};

std::unique_ptr<PositionEncoding> nope(const ModelConfig&) { return std::make_unique<NopeEncoding>(); }

}  // namespace

const std::vector<PositionMethod>& builtin_position_methods() {
  using M = const ModelConfig&;
  static const std::vector<PositionMethod> rows = {
      {"nope", nope, "no positional encoding: the causal mask alone"},
      {"none", nope, "= nope", true},
      {"rope", [](M c) { return make_rope(c, "rope", RopeScalingKind::none); }, "rotary embedding (half-split pairs), scaling from model.position.rope.scaling"},
      {"pope", [](M c) -> std::unique_ptr<PositionEncoding> { return std::make_unique<PopeEncoding>(c.position.pope); },
       "polar coordinate position embedding"},
      {"alibi", make_alibi, "fixed linear bias per head"},
      {"rope_pi", [](M c) { return make_rope(c, "rope_pi", RopeScalingKind::pi); }, "RoPE with position interpolation"},
      {"rope_ntk", [](M c) { return make_rope(c, "rope_ntk", RopeScalingKind::ntk); }, "RoPE with NTK-aware scaling"},
      {"rope_yarn", [](M c) { return make_rope(c, "rope_yarn", RopeScalingKind::yarn); }, "RoPE with YaRN"},
      {"rope_ntk_affine", [](M c) { return with_pj_bias<kAffine>("rope_ntk_affine", make_rope(c, "rope_ntk_affine", RopeScalingKind::ntk), c); },
       "RoPE (NTK) + PJ affine sector"},
      {"rope_yarn_affine", [](M c) { return with_pj_bias<kAffine>("rope_yarn_affine", make_rope(c, "rope_yarn_affine", RopeScalingKind::yarn), c); },
       "RoPE (YaRN) + PJ affine sector"},
      {"pj_rotary", make_pj_rotary, "PJ-rotary: rotation and jet shear"},
      {"affine", [](M c) { return with_pj_bias<kAffine>("affine", nope(c), c); }, "PJ affine sector alone"},
      {"fj_affine", [](M c) { return with_pj_bias<kFjAffine>("fj_affine", nope(c), c); }, "PJ Fourier–jet + affine sectors"},
      {"fj_lc", [](M c) { return with_pj_bias<kFjLc>("fj_lc", nope(c), c); }, "PJ Fourier–jet + light-cone sectors"},
      {"rope_affine", [](M c) { return with_pj_bias<kAffine>("rope_affine", make_rope(c, "rope_affine", RopeScalingKind::none), c); },
       "RoPE + PJ affine sector"},
      {"full", [](M c) { return with_pj_bias<kAll>("full", nope(c), c); }, "PJ-bias, all three sectors"},
      {"lc_affine", [](M c) { return with_pj_bias<kLcAffine>("lc_affine", nope(c), c); }, "PJ light-cone + affine sectors"},
      {"pjrope", [](M c) { return with_pj_bias<kAll>("pjrope", nope(c), c); }, "= full", true},
  };
  return rows;
}

std::unique_ptr<PositionEncoding> make_position_encoding(const ModelConfig& config) {
  const PositionMethod* method = find_position_method(config.position.kind);
  if (method == nullptr)
    throw ConfigError("model.position.kind", "unknown position encoding '" + config.position.kind +
                                                 "'; expected one of: " + position_method_names());
  if (config.n_head <= 0)
    throw ConfigError("model.n_head", "expected a positive head count, got " + std::to_string(config.n_head));
  return method->make(config);
}

}  // namespace pope
