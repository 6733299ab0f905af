// Helpers for comparing CUDA ops with the CPU reference: random inputs that both backends
// represent exactly (rounded to bf16 where the GPU takes bf16), uploads and downloads in any
// dtype, NaN poisoning of outputs, and the relative error ‖got − want‖ / ‖want‖.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "model/bf16.hpp"
#include "pope/backend.hpp"

namespace pope::test {

// Normal(0, scale²) values, rounded to bf16 so that a bf16 GPU tensor and an f32 CPU tensor
// hold the same numbers.
inline std::vector<float> random_bf16_values(std::size_t count, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = bf16_to_float(float_to_bf16(normal(engine)));
  return values;
}

// A tensor of `dtype` (f32, f64 or bf16) on `backend` holding `values` (converted on the host).
inline OwnedTensor make_tensor(Backend& backend, Shape shape, DType dtype, std::span<const float> values) {
  OwnedTensor owned = allocate_tensor(backend, std::move(shape), dtype);
  EXPECT_EQ(static_cast<std::size_t>(owned.tensor.numel()), values.size());
  switch (dtype) {
    case DType::f32: backend.copy_from_host(owned.tensor, values.data()); break;
    case DType::f64: {
      const std::vector<double> wide(values.begin(), values.end());
      backend.copy_from_host(owned.tensor, wide.data());
      break;
    }
    case DType::bf16: {
      std::vector<std::uint16_t> bits(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
      backend.copy_from_host(owned.tensor, bits.data());
      break;
    }
    default: ADD_FAILURE() << "make_tensor: unsupported dtype " << dtype_name(dtype);
  }
  return owned;
}

inline OwnedTensor make_ids(Backend& backend, const std::vector<std::int32_t>& ids) {
  OwnedTensor owned = allocate_tensor(backend, {static_cast<std::int64_t>(ids.size())}, DType::i32);
  backend.copy_from_host(owned.tensor, ids.data());
  return owned;
}

// Every element of an f32, f64 or bf16 tensor, exactly, as double.
inline std::vector<double> download(Backend& backend, const Tensor& t) {
  const std::size_t n = static_cast<std::size_t>(t.numel());
  std::vector<double> out(n);
  switch (t.dtype) {
    case DType::f32: {
      std::vector<float> host(n);
      backend.copy_to_host(host.data(), t);
      std::copy(host.begin(), host.end(), out.begin());
      break;
    }
    case DType::f64: backend.copy_to_host(out.data(), t); break;
    case DType::bf16: {
      std::vector<std::uint16_t> bits(n);
      backend.copy_to_host(bits.data(), t);
      for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_float(bits[i]);
      break;
    }
    default: ADD_FAILURE() << "download: unsupported dtype " << dtype_name(t.dtype);
  }
  return out;
}

// Fills an output with NaN so that elements an op fails to write cannot pass a comparison.
inline void poison(Backend& backend, const Tensor& t) { backend.fill(t, std::numeric_limits<double>::quiet_NaN()); }

// ‖got − want‖ / ‖want‖; infinity when sizes differ or got holds a non-finite value where want
// is finite (so NaN from an unwritten element never passes).
inline double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double difference = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(want[i])) return std::numeric_limits<double>::infinity();
    difference += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(difference) / std::sqrt(norm);
}

}  // namespace pope::test
