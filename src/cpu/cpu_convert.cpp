// Conversion between the floating-point dtypes. Every element goes through double (exact
// for f32 and bf16) except that bf16 results are rounded from f32.
#include <fmt/format.h>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"
#include "model/bf16.hpp"

namespace pope::cpu {

namespace {

double load(const void* data, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::f64: return static_cast<const double*>(data)[i];
    default: return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
  }
}

void store(void* data, DType dtype, std::int64_t i, double value) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(data)[i] = static_cast<float>(value); return;
    case DType::f64: static_cast<double*>(data)[i] = value; return;
    default: static_cast<std::uint16_t*>(data)[i] = float_to_bf16(static_cast<float>(value)); return;
  }
}

}  // namespace

void convert(int threads, Tensor dst, Tensor src) {
  check_floating("convert", "dst", dst);
  check_floating("convert", "src", src);
  require(dst.numel() == src.numel(), "convert",
          fmt::format("dst has {} elements, src {}; expected the same count", dst.numel(), src.numel()));
  parallel_for(threads, dst.numel(), [&](std::int64_t i) { store(dst.data, dst.dtype, i, load(src.data, src.dtype, i)); });
}

}  // namespace pope::cpu
