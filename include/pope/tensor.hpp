// Tensors as non-owning typed views over memory that a Backend owns, plus the
// parameter arena: all trainable weights in one contiguous buffer with named views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pope {

// e4m3, e5m2: FP8 (train.precision = "fp8"), one byte each, read with a per-tensor scale held beside.
enum class DType : std::uint8_t { f32, f64, bf16, i32, u16, e4m3, e5m2 };
enum class DeviceKind : std::uint8_t { cpu, cuda };

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
std::string_view device_name(DeviceKind device);

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::uint16_t>() { return DType::u16; }

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);

// A view: pointer, element type, device and shape (row-major, contiguous).
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  DeviceKind device = DeviceKind::cpu;
  Shape shape;

  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  std::int64_t dim(int i) const { return shape.at(static_cast<std::size_t>(i < 0 ? static_cast<int>(shape.size()) + i : i)); }
  bool empty() const { return data == nullptr; }

  // Typed pointer; throws std::logic_error when T does not match dtype.
  template <class T> T* as() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(data);
  }
  // Rows [begin, end) of the leading dimension.
  Tensor rows(std::int64_t begin, std::int64_t end) const;
  // The same memory seen with another shape of equal element count.
  Tensor reshaped(Shape new_shape) const;

  void check_dtype(DType expected) const;
};

// Owned device or host memory; freed by the deleter the backend supplies.
using Buffer = std::shared_ptr<void>;

// The closed interval [lowest, highest] that the optimizer projects a parameter back into after
// every update (projected gradient descent), both rounded to the parameter dtype.
struct ParamBounds {
  double lowest = 0.0;
  double highest = 0.0;
};

// Trainable parameter description: name as stored in checkpoints, shape, whether AdamW's
// decoupled weight decay applies (2-D weight matrices only), its initialiser and its bounds.
enum class InitKind : std::uint8_t { normal, ones, zeros, uniform, custom };
struct ParamSpec {
  std::string name;
  Shape shape;
  bool weight_decay = false;
  InitKind init = InitKind::normal;
  double init_a = 0.0;  // normal: std; uniform: low; ones/zeros: unused
  double init_b = 0.0;  // uniform: high
  std::optional<ParamBounds> bounds = std::nullopt;  // none: unbounded
};

// All parameters in one contiguous allocation (so optimizer, gradient norm, all-reduce
// and checkpointing each touch one buffer), addressed through named views.
class ParameterLayout {
 public:
  void add(ParamSpec spec);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  std::int64_t offset(std::size_t index) const { return offsets_.at(index); }
  std::int64_t total_numel() const { return total_; }
  std::size_t index_of(std::string_view name) const;  // throws std::out_of_range naming it
  bool contains(std::string_view name) const;
  // View of parameter `index` inside a flat buffer laid out by this layout.
  Tensor view(const Tensor& flat, std::size_t index) const;
  Tensor view(const Tensor& flat, std::string_view name) const { return view(flat, index_of(name)); }

 private:
  std::vector<ParamSpec> specs_;
  std::vector<std::int64_t> offsets_;
  std::int64_t total_ = 0;
};

}  // namespace pope
