// The train.* and attention.* keys that choose how a Model computes (activation recompute,
// deterministic attention, the attention impl, the precision of the linear layers), applied the
// same way by the trainer and by pope-bench train.
#pragma once

#include "pope/config.hpp"
#include "pope/model.hpp"

namespace pope {

// Throws ConfigError naming train.precision when it asks for fp8 on a backend without FP8 tensor cores.
void apply_model_options(Model& model, const RunConfig& config);

}  // namespace pope
