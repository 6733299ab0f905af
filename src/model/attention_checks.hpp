// Argument validation shared by the backends' attention ops: the call's shape, its encoding and
// its position context agree. Each backend adds its own checks (tensors, kernel limits) after.
#pragma once

#include <string_view>

#include "pope/backend.hpp"
#include "pope/position.hpp"

namespace pope::checks {

// encoding is set, every dimension of shape is positive and ctx describes the same seq_len,
// n_head and head_dim; otherwise throws std::invalid_argument naming `op` and what differs.
void check_attention_call(std::string_view op, const AttentionShape& shape, const PositionEncoding* encoding,
                          const PositionContext& ctx);

}  // namespace pope::checks
