// make_position_encoding: the one place that maps model.position.kind to an encoding.
#include <memory>
#include <string>

#include "position_encodings.hpp"
#include "rope_frequencies.hpp"

namespace pope {

std::unique_ptr<PositionEncoding> make_position_encoding(const ModelConfig& config) {
  const PositionConfig& position = config.position;
  if (position.kind == "nope") return std::make_unique<NopeEncoding>();
  if (position.kind == "rope") {
    // The rotating width depends on head_dim, which only the model config knows: check it
    // now rather than on the first forward pass.
    if (config.n_head <= 0)
      throw ConfigError("model.n_head", "expected a positive head count, got " + std::to_string(config.n_head));
    rope_rotary_dim(position.rope.fraction, config.head_dim());
    return std::make_unique<RopeEncoding>(position.rope);
  }
  if (position.kind == "pope") return std::make_unique<PopeEncoding>(position.pope);
  if (position.kind == "alibi") return std::make_unique<AlibiEncoding>(position.alibi);
  throw ConfigError("model.position.kind",
                    "unknown position encoding '" + position.kind + "'; expected one of: nope, rope, pope, alibi");
}

}  // namespace pope
