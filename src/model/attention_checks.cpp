#include "model/attention_checks.hpp"

#include <fmt/format.h>

#include "model/tensor_checks.hpp"

namespace pope::checks {

void check_attention_call(std::string_view op, const AttentionShape& shape, const PositionEncoding* encoding,
                          const PositionContext& ctx) {
  require(encoding != nullptr, op, "encoding is null, expected the layer's PositionEncoding (NoPE for none)");
  require(shape.batch > 0 && shape.seq_len > 0 && shape.n_head > 0 && shape.head_dim > 0, op,
          fmt::format("shape is batch {}, seq_len {}, n_head {}, head_dim {}; expected all > 0", shape.batch,
                      shape.seq_len, shape.n_head, shape.head_dim));
  require(ctx.seq_len == shape.seq_len && ctx.n_head == shape.n_head && ctx.head_dim == shape.head_dim, op,
          fmt::format("position context says seq_len {}, n_head {}, head_dim {}; the call's shape says {}, {}, {}",
                      ctx.seq_len, ctx.n_head, ctx.head_dim, shape.seq_len, shape.n_head, shape.head_dim));
}

}  // namespace pope::checks
