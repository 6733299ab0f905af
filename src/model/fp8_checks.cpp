#include "model/fp8_checks.hpp"

#include <fmt/format.h>

#include "model/tensor_checks.hpp"
#include "pope/backend.hpp"

namespace pope::checks {

namespace {

// A dequantization factor: f32 [1], or a row [1, kFp8FactorRow] of fp8_update_scales' scale_inv.
void check_fp8_factor(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t) {
  if (t.shape.size() == 2) {
    check_matrix(device, op, name, t, DType::f32, 1, kFp8FactorRow);
  } else {
    check_vector(device, op, name, t, DType::f32, 1);
  }
}

void check_fp8_matrix(DeviceKind device, std::string_view op, std::string_view name, const Tensor& t) {
  require(is_fp8(t.dtype), op, fmt::format("{} is {}, expected e4m3 or e5m2", name, dtype_name(t.dtype)));
  check_2d(device, op, name, t, t.dtype);
}

}  // namespace

bool is_fp8(DType dtype) { return dtype == DType::e4m3 || dtype == DType::e5m2; }

Fp8CastShape check_fp8_cast(DeviceKind device, const Tensor& out, const Tensor& out_t, const Tensor& x, DType x_dtype,
                            const Tensor& scale, const Tensor& amax, const Tensor& pre, bool expects_pre) {
  constexpr std::string_view op = "fp8_cast";
  check_2d(device, op, "x", x, x_dtype);
  if (expects_pre) {
    check_matrix(device, op, "pre", pre, x_dtype, x.dim(0), x.dim(1));
  } else {
    require(pre.empty(), op, "pre is given, but only the gelu_backward prologue reads it");
  }
  Fp8CastShape shape{x.dim(0), x.dim(1), !out.empty() ? out.dtype : out_t.dtype};
  require(!out.empty() || !out_t.empty(), op, "expected out, out_t or both");
  if (!out.empty()) {
    check_fp8_matrix(device, op, "out", out);
    require(out.dim(0) == shape.rows && out.dim(1) == shape.cols, op,
            fmt::format("out is {}, expected [{}, {}] as x", shape_string(out.shape), shape.rows, shape.cols));
  }
  if (!out_t.empty()) {
    check_fp8_matrix(device, op, "out_t", out_t);
    require(out_t.dtype == shape.format && out_t.dim(0) == shape.cols && out_t.dim(1) == shape.rows, op,
            fmt::format("out_t is {} {}, expected {} [{}, {}], x transposed", dtype_name(out_t.dtype),
                        shape_string(out_t.shape), dtype_name(shape.format), shape.cols, shape.rows));
  }
  check_vector(device, op, "scale", scale, DType::f32, 1);
  check_vector(device, op, "amax", amax, DType::f32, 1);
  return shape;
}

std::int64_t check_fp8_update(DeviceKind device, const Tensor& amax, const Tensor& history, const Tensor& scale,
                              const Tensor& scale_inv, DType format) {
  constexpr std::string_view op = "fp8_update_scales";
  require(is_fp8(format), op, fmt::format("format is {}, expected e4m3 or e5m2", dtype_name(format)));
  check_2d(device, op, "history", history, DType::f32);
  const std::int64_t k = history.dim(0);
  require(history.dim(1) >= 1, op, "history needs at least one column");
  check_vector(device, op, "amax", amax, DType::f32, k);
  check_vector(device, op, "scale", scale, DType::f32, k);
  check_matrix(device, op, "scale_inv", scale_inv, DType::f32, k, kFp8FactorRow);
  return k;
}

Fp8MatmulShape check_fp8_matmul(DeviceKind device, const Tensor& out, const Tensor& a, const Tensor& a_scale_inv,
                                const Tensor& b, const Tensor& b_scale_inv, DType out_dtype, const Tensor& addend) {
  constexpr std::string_view op = "fp8_matmul";
  check_fp8_matrix(device, op, "a", a);
  check_fp8_matrix(device, op, "b", b);
  require(!(a.dtype == DType::e5m2 && b.dtype == DType::e5m2), op, "a and b are both e5m2; one must be e4m3");
  const Fp8MatmulShape shape{a.dim(0), b.dim(0), a.dim(1)};
  require(b.dim(1) == shape.k, op,
          fmt::format("a is {} and b {}: expected b [N, {}]", shape_string(a.shape), shape_string(b.shape), shape.k));
  require(out.dtype == out_dtype || out.dtype == DType::f32, op,
          fmt::format("out is {}, expected {} or f32", dtype_name(out.dtype), dtype_name(out_dtype)));
  check_matrix(device, op, "out", out, out.dtype, shape.m, shape.n);
  if (!addend.empty()) check_matrix(device, op, "addend", addend, out.dtype, shape.m, shape.n);
  check_fp8_factor(device, op, "a_scale_inv", a_scale_inv);
  check_fp8_factor(device, op, "b_scale_inv", b_scale_inv);
  return shape;
}

}  // namespace pope::checks
