// Argument validation for the CPU ops: the shared checks (model/tensor_checks.hpp) for
// tensors that must live in host memory.
#pragma once

#include "model/tensor_checks.hpp"

namespace pope::cpu {

using checks::fail;
using checks::require;

inline void check_vector(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t numel) {
  checks::check_vector(DeviceKind::cpu, op, name, t, dtype, numel);
}
inline void check_matrix(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t rows,
                         std::int64_t cols) {
  checks::check_matrix(DeviceKind::cpu, op, name, t, dtype, rows, cols);
}
inline void check_2d(std::string_view op, std::string_view name, const Tensor& t, DType dtype) {
  checks::check_2d(DeviceKind::cpu, op, name, t, dtype);
}
inline std::int64_t check_logits(std::string_view op, const Tensor& logits, DType dtype, int vocab_size) {
  return checks::check_logits(DeviceKind::cpu, op, logits, dtype, vocab_size);
}
inline void check_floating(std::string_view op, std::string_view name, const Tensor& t) {
  checks::check_floating(DeviceKind::cpu, op, name, t);
}

}  // namespace pope::cpu
