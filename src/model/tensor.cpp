#include "pope/tensor.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace pope {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::u16: return 2;
    case DType::e4m3: return 1;
    case DType::e5m2: return 1;
  }
  throw std::logic_error("unknown dtype");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u16: return "u16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
  }
  return "?";
}

std::string_view device_name(DeviceKind device) { return device == DeviceKind::cpu ? "cpu" : "cuda"; }

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string shape_string(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

void Tensor::check_dtype(DType expected) const {
  if (dtype != expected)
    throw std::logic_error(fmt::format("tensor {} has dtype {}, expected {}", shape_string(shape), dtype_name(dtype),
                                       dtype_name(expected)));
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
  if (shape.empty() || begin < 0 || end < begin || end > shape[0])
    throw std::logic_error(fmt::format("rows [{}, {}) out of range for tensor {}", begin, end, shape_string(shape)));
  Tensor t = *this;
  const std::int64_t row_numel = shape[0] == 0 ? 0 : numel() / shape[0];
  t.data = static_cast<char*>(data) + static_cast<std::size_t>(begin * row_numel) * dtype_size(dtype);
  t.shape[0] = end - begin;
  return t;
}

Tensor Tensor::reshaped(Shape new_shape) const {
  if (shape_numel(new_shape) != numel())
    throw std::logic_error(fmt::format("cannot view {} as {}", shape_string(shape), shape_string(new_shape)));
  Tensor t = *this;
  t.shape = std::move(new_shape);
  return t;
}

// Each parameter starts on a 64-element boundary so that vectorised kernels never
// straddle two parameters; padding elements stay zero in values, gradients and moments.
static constexpr std::int64_t kParamAlignment = 64;

void ParameterLayout::add(ParamSpec spec) {
  if (contains(spec.name)) throw std::logic_error("duplicate parameter name " + spec.name);
  offsets_.push_back(total_);
  total_ += (shape_numel(spec.shape) + kParamAlignment - 1) / kParamAlignment * kParamAlignment;
  specs_.push_back(std::move(spec));
}

std::size_t ParameterLayout::index_of(std::string_view name) const {
  for (std::size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return i;
  throw std::out_of_range(fmt::format("no parameter named '{}'", name));
}

bool ParameterLayout::contains(std::string_view name) const {
  for (const auto& s : specs_)
    if (s.name == name) return true;
  return false;
}

Tensor ParameterLayout::view(const Tensor& flat, std::size_t index) const {
  if (flat.numel() != total_)
    throw std::logic_error(fmt::format("flat buffer has {} elements, layout needs {}", flat.numel(), total_));
  Tensor t = flat;
  t.data = static_cast<char*>(flat.data) + static_cast<std::size_t>(offsets_.at(index)) * dtype_size(flat.dtype);
  t.shape = specs_.at(index).shape;
  return t;
}

}  // namespace pope
