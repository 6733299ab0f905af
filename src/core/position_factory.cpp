// make_position_encoding: the one place that maps model.position.kind to an encoding. A
// method is looked up in position_methods(): its q/k transform is built here and, when the
// method has a PJ-bias, composed with it.
#include <memory>
#include <string>

#include "position_encodings.hpp"
#include "position_methods.hpp"
#include "rope_frequencies.hpp"

namespace pope {

namespace {

// RoPE with the method's fixed scaling, if it has one. A different scaling configured in
// model.position.rope.scaling.kind contradicts the method's name and is refused.
std::unique_ptr<PositionEncoding> make_rope(const PositionMethod& method, const ModelConfig& config) {
  // The rotating width depends on head_dim, which only the model config knows: check it
  // now rather than on the first forward pass.
  if (config.n_head <= 0)
    throw ConfigError("model.n_head", "expected a positive head count, got " + std::to_string(config.n_head));
  RopeConfig rope = config.position.rope;
  if (!method.rope_scaling.empty()) {
    if (rope.scaling.kind != "none" && rope.scaling.kind != method.rope_scaling)
      throw ConfigError("model.position.rope.scaling.kind",
                        "kind '" + std::string(method.name) + "' uses the scaling '" + std::string(method.rope_scaling) +
                            "', but '" + rope.scaling.kind + "' is configured; expected none or " +
                            std::string(method.rope_scaling));
    rope.scaling.kind = std::string(method.rope_scaling);
  }
  rope_rotary_dim(rope.fraction, config.head_dim());
  return std::make_unique<RopeEncoding>(rope);
}

std::unique_ptr<PositionEncoding> make_transform(const PositionMethod& method, const ModelConfig& config) {
  switch (method.transform) {
    case MethodTransform::none: return std::make_unique<NopeEncoding>();
    case MethodTransform::rope: return make_rope(method, config);
    case MethodTransform::pope: return std::make_unique<PopeEncoding>(config.position.pope);
    case MethodTransform::pj_rotary: {
      auto rotary = std::make_unique<PjRotaryEncoding>(config.position.pj);
      if (config.n_head > 0) rotary->blocks(config.head_dim());  // head_dim must split into blocks
      return rotary;
    }
  }
  throw std::logic_error("make_position_encoding: unhandled transform");
}

}  // namespace

std::unique_ptr<PositionEncoding> make_position_encoding(const ModelConfig& config) {
  const PositionConfig& position = config.position;
  const PositionMethod* method = find_position_method(position.kind);
  if (method == nullptr)
    throw ConfigError("model.position.kind",
                      "unknown position encoding '" + position.kind + "'; expected one of: " + position_method_names());
  if (method->alibi) return std::make_unique<AlibiEncoding>(position.alibi);
  std::unique_ptr<PositionEncoding> transform = make_transform(*method, config);
  if (!method->pj_bias) return transform;
  auto bias = std::make_unique<PjBiasEncoding>(position.pj, *method->pj_bias, config.context_length);
  return std::make_unique<ComposedEncoding>(std::string(method->name), std::move(transform), std::move(bias));
}

}  // namespace pope
