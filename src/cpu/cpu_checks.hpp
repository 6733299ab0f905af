// Argument validation shared by the CPU ops. A mismatch throws std::invalid_argument whose
// message names the op, the argument and what was expected, e.g.
//   "rmsnorm_forward: gain is f32 [768], expected f32 with 1024 elements".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "pope/tensor.hpp"

namespace pope::cpu {

[[noreturn]] void fail(std::string_view op, const std::string& message);
inline void require(bool ok, std::string_view op, const std::string& message) {
  if (!ok) fail(op, message);
}

// A host tensor of `dtype` with `numel` elements.
void check_vector(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t numel);
// A host tensor of `dtype` seen as [rows, cols]: its last dimension is cols and it holds
// rows·cols elements (so [B, T, C] and [B·T, C] both pass).
void check_matrix(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t rows,
                  std::int64_t cols);
// A 2-D host tensor of `dtype`.
void check_2d(std::string_view op, std::string_view name, const Tensor& t, DType dtype);
// A host tensor of any floating-point dtype (f32, f64, bf16).
void check_floating(std::string_view op, std::string_view name, const Tensor& t);

}  // namespace pope::cpu
