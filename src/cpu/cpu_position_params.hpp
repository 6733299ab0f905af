// Raw pointers to one layer's position parameters (or gradients), checked against the
// encoding's parameter list entry by entry: the CPU attention ops' view of position_params.
#pragma once

#include <fmt/format.h>

#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cpu/cpu_checks.hpp"
#include "pope/backend.hpp"
#include "pope/position.hpp"

namespace pope::cpu {

template <class Pointer>
std::vector<Pointer> position_parameter_pointers(std::string_view op, std::string_view name,
                                                 std::span<const Tensor> tensors, const PositionEncoding& encoding,
                                                 int n_head, int head_dim) {
  using Real = std::remove_const_t<std::remove_pointer_t<Pointer>>;
  const std::vector<ParamSpec> specs = encoding.layer_parameters(n_head, head_dim);
  require(tensors.size() == specs.size(), op,
          fmt::format("{} has {} tensors, encoding '{}' has {} layer parameters", name, tensors.size(),
                      encoding.kind(), specs.size()));
  std::vector<Pointer> pointers;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    check_vector(op, fmt::format("{}[{}] ({})", name, i, specs[i].name), tensors[i], dtype_of<Real>(),
                 shape_numel(specs[i].shape));
    pointers.push_back(tensors[i].as<Real>());
  }
  return pointers;
}

}  // namespace pope::cpu
