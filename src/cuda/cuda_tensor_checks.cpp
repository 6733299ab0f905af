#include "cuda/cuda_tensor_checks.hpp"

#include <fmt/format.h>

#include <limits>
#include <stdexcept>

namespace pope::cuda {

void check_int_range(std::string_view op, std::string_view what, std::int64_t value) {
  require(
      value <= std::numeric_limits<int>::max(), op,
      fmt::format("{} is {}, more than the CUDA kernels' limit of {}", what, value, std::numeric_limits<int>::max()));
}

}  // namespace pope::cuda
