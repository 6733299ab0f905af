// Which sequences of a global batch each data-parallel rank reads (see distributed.hpp).
#include <fmt/format.h>

#include <stdexcept>

#include "pope/distributed.hpp"

namespace pope {

std::uint64_t micro_batch_first_sample(std::uint64_t step_first_sample, int micro_batch_size, int accumulation,
                                       int rank, int micro) {
  if (micro_batch_size < 1 || accumulation < 1 || rank < 0 || micro < 0 || micro >= accumulation)
    throw std::invalid_argument(fmt::format("micro_batch_first_sample: micro-batch {} of {} (size {}) on rank {}; "
                                            "expected positive sizes, 0 <= micro < accumulation and rank >= 0",
                                            micro, accumulation, micro_batch_size, rank));
  const std::uint64_t block = std::uint64_t(rank) * std::uint64_t(accumulation) + std::uint64_t(micro);
  return step_first_sample + block * std::uint64_t(micro_batch_size);
}

}  // namespace pope
