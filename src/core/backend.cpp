#include "pope/backend.hpp"

namespace pope {

OwnedTensor allocate_tensor(Backend& backend, Shape shape, DType dtype) {
  OwnedTensor owned;
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  owned.buffer = backend.allocate(bytes == 0 ? 1 : bytes);
  owned.tensor = Tensor{owned.buffer.get(), dtype, backend.device(), std::move(shape)};
  return owned;
}

}  // namespace pope
