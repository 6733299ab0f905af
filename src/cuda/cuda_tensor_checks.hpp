// Argument validation for the CUDA ops: the shared checks (model/tensor_checks.hpp) for
// tensors that must live in device memory, and the kernels' 32-bit index limit.
#pragma once

#include <cstdint>

#include "model/tensor_checks.hpp"

namespace pope::cuda {

using checks::fail;
using checks::require;

inline void check_vector(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t numel) {
  checks::check_vector(DeviceKind::cuda, op, name, t, dtype, numel);
}
inline void check_matrix(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t rows,
                         std::int64_t cols) {
  checks::check_matrix(DeviceKind::cuda, op, name, t, dtype, rows, cols);
}
inline void check_2d(std::string_view op, std::string_view name, const Tensor& t, DType dtype) {
  checks::check_2d(DeviceKind::cuda, op, name, t, dtype);
}
inline std::int64_t check_logits(std::string_view op, const Tensor& logits, DType dtype, int vocab_size) {
  return checks::check_logits(DeviceKind::cuda, op, logits, dtype, vocab_size);
}
inline void check_floating(std::string_view op, std::string_view name, const Tensor& t) {
  checks::check_floating(DeviceKind::cuda, op, name, t);
}

// `value` (a row count, width or element count) fits the kernels' 32-bit int indices.
void check_int_range(std::string_view op, std::string_view what, std::int64_t value);

}  // namespace pope::cuda
