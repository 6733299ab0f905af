// Parallel loops for the CPU backend. Every op is written so that its result does not
// depend on how many threads run it: work is split into fixed pieces whose results never
// mix, or partial sums over fixed chunks are combined in index order. parallel_for itself
// (model/parallel_for.hpp) is shared with parameter initialisation.
#pragma once


#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/parallel_for.hpp"

namespace pope::cpu {

// Σ_i term(i) over [0, n) in double, summed per fixed chunk of indices and the chunk sums
// then added in order, so the rounding is the same for any thread count.
template <class Term> double deterministic_sum(int threads, std::int64_t n, Term&& term) {
  constexpr std::int64_t kChunk = 4096;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<std::size_t>(chunks), 0.0);
  parallel_for(threads, chunks, [&](std::int64_t c) {
    double sum = 0.0;
    const std::int64_t end = std::min(n, (c + 1) * kChunk);
    for (std::int64_t i = c * kChunk; i < end; ++i) sum += term(i);
    partial[static_cast<std::size_t>(c)] = sum;
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

// Columns [0, width) cut into fixed blocks: column-parallel reductions over rows (the
// gain gradient of rmsnorm, the embedding gradient) give each block to one thread, which
// then adds the rows in order.
struct ColumnBlock {
  std::int64_t begin, end;
};
inline constexpr std::int64_t kColumnBlock = 64;
inline std::int64_t column_block_count(std::int64_t width) { return (width + kColumnBlock - 1) / kColumnBlock; }
inline ColumnBlock column_block(std::int64_t index, std::int64_t width) {
  return {index * kColumnBlock, std::min(width, (index + 1) * kColumnBlock)};
}

}  // namespace pope::cpu
