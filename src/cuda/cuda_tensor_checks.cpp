#include "cuda/cuda_tensor_checks.hpp"

#include <fmt/format.h>

#include <limits>
#include <stdexcept>

namespace pope::cuda {

namespace {
std::string describe(const Tensor& t) { return fmt::format("{} {}", dtype_name(t.dtype), shape_string(t.shape)); }

void check_device(std::string_view op, std::string_view name, const Tensor& t) {
  require(t.device == DeviceKind::cuda, op,
          fmt::format("{} lives on {}, expected CUDA device memory", name, device_name(t.device)));
  require(!t.empty() || t.numel() == 0, op, fmt::format("{} ({}) has no data", name, describe(t)));
}
}  // namespace

void fail(std::string_view op, const std::string& message) {
  throw std::invalid_argument(fmt::format("{}: {}", op, message));
}

void check_vector(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t numel) {
  check_device(op, name, t);
  require(t.dtype == dtype && t.numel() == numel, op,
          fmt::format("{} is {}, expected {} with {} elements", name, describe(t), dtype_name(dtype), numel));
}

void check_matrix(std::string_view op, std::string_view name, const Tensor& t, DType dtype, std::int64_t rows,
                  std::int64_t cols) {
  check_device(op, name, t);
  const bool shape_ok = !t.shape.empty() && t.shape.back() == cols && t.numel() == rows * cols;
  require(t.dtype == dtype && shape_ok, op,
          fmt::format("{} is {}, expected {} [{}, {}]", name, describe(t), dtype_name(dtype), rows, cols));
}

void check_2d(std::string_view op, std::string_view name, const Tensor& t, DType dtype) {
  check_device(op, name, t);
  require(t.dtype == dtype && t.shape.size() == 2, op,
          fmt::format("{} is {}, expected a 2-D {} tensor", name, describe(t), dtype_name(dtype)));
}

void check_floating(std::string_view op, std::string_view name, const Tensor& t) {
  check_device(op, name, t);
  const bool floating = t.dtype == DType::f32 || t.dtype == DType::f64 || t.dtype == DType::bf16;
  require(floating, op, fmt::format("{} is {}, expected f32, f64 or bf16", name, describe(t)));
}

void check_int_range(std::string_view op, std::string_view what, std::int64_t value) {
  require(
      value <= std::numeric_limits<int>::max(), op,
      fmt::format("{} is {}, more than the CUDA kernels' limit of {}", what, value, std::numeric_limits<int>::max()));
}

}  // namespace pope::cuda
