#include "runtime/model_options.hpp"

#include <fmt/format.h>

namespace pope {

void apply_model_options(Model& model, const RunConfig& config) {
  model.set_activation_recompute(config.train.activation_recompute);
  model.set_deterministic(config.train.deterministic);
  model.set_attention_impl(config.attention.impl);
  if (config.train.precision == Precision::fp8) {
    if (!model.backend().has_fp8_tensor_cores())
      throw ConfigError("train.precision",
                        fmt::format("expected bf16: {} has no FP8 tensor cores (fp8 needs a CUDA GPU of sm_89 or later)",
                                    model.backend().description()));
    model.set_fp8(config.train.fp8_amax_history);
  }
}

}  // namespace pope
