// Argument validation for the CUDA backend's ops: the same checks and messages as the CPU
// backend's (cpu/cpu_checks.hpp), for tensors that must live in device memory. A mismatch
// throws std::invalid_argument naming the op, the argument and what was expected, e.g.
//   "rmsnorm_forward: gain is f32 [768], expected bf16 with 768 elements".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "pope/tensor.hpp"

namespace pope::cuda {

[[noreturn]] void fail(std::string_view op, const std::string& message);
inline void require(bool ok, std::string_view op, const std::string& message) {
  if (!ok) fail(op, message);
}

// A device tensor of `dtype` with `numel` elements.
void check_vector(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t numel);
// A device tensor of `dtype` seen as [rows, cols] (its last dimension is cols).
void check_matrix(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t rows,
                  std::int64_t cols);
// A 2-D device tensor of `dtype`.
void check_2d(std::string_view op, std::string_view name, const Tensor& t, DType dtype);
// A device tensor of f32, f64 or bf16.
void check_floating(std::string_view op, std::string_view name, const Tensor& t);
// `value` (a row count, width or element count) fits the kernels' 32-bit int indices.
void check_int_range(std::string_view op, std::string_view what, std::int64_t value);

}  // namespace pope::cuda
