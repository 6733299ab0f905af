// A parameter's initial values as its ParamSpec describes them: the model initialises its
// parameters with this, and `pope-bench attention` its positional parameters, so that the
// encodings are timed at the values training starts from.
#pragma once

#include <functional>
#include <span>

#include "pope/rng.hpp"
#include "pope/tensor.hpp"

namespace pope {

// out[k] = scale · (k-th rng.normal()), the values out.size() calls in a row would give.
void fill_normal(Rng& rng, double scale, std::span<double> out);

// Fills `out` as `spec.init` says; InitKind::custom values come from `custom` (the positional
// encoding's initialize_custom for that parameter).
void initialize_parameter(const ParamSpec& spec, Rng& rng, std::span<double> out,
                          const std::function<void(std::span<double>)>& custom);

}  // namespace pope
