#include "model/tensor_checks.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace pope::checks {

namespace {
std::string describe(const Tensor& t) { return fmt::format("{} {}", dtype_name(t.dtype), shape_string(t.shape)); }

void check_location(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t) {
  require(t.device == device, op,
          fmt::format("{} lives on {}, expected {}", name, device_name(t.device),
                      device == DeviceKind::cpu ? "host memory" : "CUDA device memory"));
  require(!t.empty() || t.numel() == 0, op, fmt::format("{} ({}) has no data", name, describe(t)));
}
}  // namespace

void fail(std::string_view op, const std::string& message) {
  throw std::invalid_argument(fmt::format("{}: {}", op, message));
}

void check_vector(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t, DType dtype,
                  std::int64_t numel) {
  check_location(device, op, name, t);
  require(t.dtype == dtype && t.numel() == numel, op,
          fmt::format("{} is {}, expected {} with {} elements", name, describe(t), dtype_name(dtype), numel));
}

void check_matrix(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t, DType dtype,
                  std::int64_t rows, std::int64_t cols) {
  check_location(device, op, name, t);
  const bool shape_ok = !t.shape.empty() && t.shape.back() == cols && t.numel() == rows * cols;
  require(t.dtype == dtype && shape_ok, op,
          fmt::format("{} is {}, expected {} [{}, {}]", name, describe(t), dtype_name(dtype), rows, cols));
}

void check_2d(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t, DType dtype) {
  check_location(device, op, name, t);
  require(t.dtype == dtype && t.shape.size() == 2, op,
          fmt::format("{} is {}, expected a 2-D {} tensor", name, describe(t), dtype_name(dtype)));
}

std::int64_t check_logits(DeviceKind device, std::string_view op, const Tensor& logits, DType dtype, int vocab_size) {
  check_2d(device, op, "logits", logits, dtype);
  require(vocab_size > 0 && vocab_size <= logits.dim(1), op,
          fmt::format("vocab_size is {}, expected 1..{} (the logits' width)", vocab_size, logits.dim(1)));
  return logits.dim(0);
}

void check_floating(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t) {
  check_location(device, op, name, t);
  const bool floating = t.dtype == DType::f32 || t.dtype == DType::f64 || t.dtype == DType::bf16;
  require(floating, op, fmt::format("{} is {}, expected f32, f64 or bf16", name, describe(t)));
}

}  // namespace pope::checks
