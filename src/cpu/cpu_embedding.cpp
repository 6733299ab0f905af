// Token embedding lookup and its gradient. The backward adds rows of dout into rows of
// dwte picked by token id; several positions share a token, so it is parallel over column
// blocks instead of positions: each block belongs to one thread, which adds positions in
// order (deterministic, no atomics).
#include <fmt/format.h>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"

namespace pope::cpu {

namespace {

// Checks every token id against the vocabulary before any memory is touched.
void check_token_ids(std::string_view op, Tensor tokens, std::int64_t vocab_size) {
  const auto* ids = tokens.as<std::int32_t>();
  for (std::int64_t n = 0; n < tokens.numel(); ++n)
    require(ids[n] >= 0 && ids[n] < vocab_size, op,
            fmt::format("tokens[{}] = {} is outside the embedding table's {} rows", n, ids[n], vocab_size));
}

}  // namespace

template <class Real> void embedding_forward(int threads, Tensor out, Tensor tokens, Tensor wte) {
  constexpr std::string_view op = "embedding_forward";
  check_2d(op, "wte", wte, dtype_of<Real>());
  const std::int64_t rows = tokens.numel(), width = wte.dim(1);
  check_vector(op, "tokens", tokens, DType::i32, rows);
  check_matrix(op, "out", out, dtype_of<Real>(), rows, width);
  check_token_ids(op, tokens, wte.dim(0));

  const auto* ids = tokens.as<std::int32_t>();
  const Real* table = wte.as<Real>();
  Real* y = out.as<Real>();
  parallel_for(threads, rows, [&](std::int64_t n) {
    const Real* row = table + ids[n] * width;
    std::copy(row, row + width, y + n * width);
  });
}

template <class Real> void embedding_backward(int threads, Tensor dwte, Tensor dout, Tensor tokens) {
  constexpr std::string_view op = "embedding_backward";
  check_2d(op, "dwte", dwte, dtype_of<Real>());
  const std::int64_t rows = tokens.numel(), width = dwte.dim(1);
  check_vector(op, "tokens", tokens, DType::i32, rows);
  check_matrix(op, "dout", dout, dtype_of<Real>(), rows, width);
  check_token_ids(op, tokens, dwte.dim(0));

  const auto* ids = tokens.as<std::int32_t>();
  const Real* dy = dout.as<Real>();
  Real* dtable = dwte.as<Real>();
  parallel_for(threads, column_block_count(width), [&](std::int64_t block_index) {
    const ColumnBlock block = column_block(block_index, width);
    for (std::int64_t n = 0; n < rows; ++n) {
      Real* target = dtable + ids[n] * width;
      const Real* source = dy + n * width;
      for (std::int64_t c = block.begin; c < block.end; ++c) target[c] += source[c];
    }
  });
}

template void embedding_forward<float>(int, Tensor, Tensor, Tensor);
template void embedding_forward<double>(int, Tensor, Tensor, Tensor);
template void embedding_backward<float>(int, Tensor, Tensor, Tensor);
template void embedding_backward<double>(int, Tensor, Tensor, Tensor);

}  // namespace pope::cpu
