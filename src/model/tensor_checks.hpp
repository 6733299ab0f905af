// Argument validation shared by the backends' ops. A mismatch throws std::invalid_argument
// whose message names the op, the argument and what was expected, e.g.
//   "rmsnorm_forward: gain is f32 [768], expected bf16 with 768 elements".
// Each check also requires the tensor to live on `device` (host memory for the CPU backend,
// device memory for CUDA); cpu/cpu_checks.hpp and cuda/cuda_tensor_checks.hpp bind it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "pope/tensor.hpp"

namespace pope::checks {

[[noreturn]] void fail(std::string_view op, const std::string& message);
inline void require(bool ok, std::string_view op, const std::string& message) {
  if (!ok) fail(op, message);
}

// A tensor of `dtype` with `numel` elements.
void check_vector(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t, DType dtype,
                  std::int64_t numel);
// A tensor of `dtype` seen as [rows, cols]: its last dimension is cols and it holds
// rows·cols elements (so [B, T, C] and [B·T, C] both pass).
void check_matrix(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t, DType dtype,
                  std::int64_t rows, std::int64_t cols);
// A 2-D tensor of `dtype`.
void check_2d(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t, DType dtype);
// Logits rows of `dtype` [rows, padded] whose first vocab_size columns are real (1 ≤ vocab_size ≤
// padded); returns the rows.
std::int64_t check_logits(DeviceKind device, std::string_view op, const Tensor& logits, DType dtype, int vocab_size);
// A tensor of any floating-point dtype (f32, f64, bf16).
void check_floating(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t);

}  // namespace pope::checks
