#include "pope/backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "model/bf16.hpp"

namespace pope {

void Backend::attention_decode(const AttentionDecode& args) {
  throw std::logic_error(fmt::format("{} has no incremental decoding (attention_decode) for encoding '{}'",
                                     description(), args.encoding ? args.encoding->kind() : "?"));
}

std::unique_ptr<GraphCapture> Backend::make_graph_capture() {
  throw std::logic_error(fmt::format("{} cannot record work for replay (supports_graphs() is false)", description()));
}

void Backend::matmul_epilogue(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b,
                              MatmulEpilogue epilogue, Tensor aux) {
  switch (epilogue) {
    case MatmulEpilogue::add:
      if (aux.data == out.data)
        throw std::invalid_argument("matmul_epilogue(add): aux aliases out; expected a separate addend");
      matmul(out, a, b, transpose_a, transpose_b);
      add(out, out, aux);
      return;
    case MatmulEpilogue::gelu:
      matmul(aux, a, b, transpose_a, transpose_b);
      gelu_forward(out, aux);
      return;
    case MatmulEpilogue::gelu_backward:
      matmul(out, a, b, transpose_a, transpose_b);
      gelu_backward(out, out, aux);
      return;
  }
  throw std::logic_error("matmul_epilogue: unhandled epilogue");
}

void Backend::rmsnorm_matmul(Tensor out, Tensor norm, Tensor rstd, Tensor x, Tensor gain, double eps, Tensor w,
                             std::optional<MatmulEpilogue> epilogue, Tensor aux) {
  rmsnorm_forward(norm, rstd, x, gain, eps);
  if (epilogue) {
    matmul_epilogue(out, norm, w, false, true, *epilogue, aux);
  } else {
    matmul(out, norm, w, false, true);
  }
}

OwnedTensor allocate_tensor(Backend& backend, Shape shape, DType dtype) {
  OwnedTensor owned;
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  owned.buffer = backend.allocate(bytes == 0 ? 1 : bytes);
  owned.tensor = Tensor{owned.buffer.get(), dtype, backend.device(), std::move(shape)};
  return owned;
}

namespace {

// Copies an f32, f64 or bf16 tensor to the host as Out, converting on the host side.
template <class Out> std::vector<Out> to_host(Backend& backend, const Tensor& tensor) {
  std::vector<Out> out(static_cast<std::size_t>(tensor.numel()));
  if (tensor.dtype == dtype_of<Out>()) {
    backend.copy_to_host(out.data(), tensor);
  } else if (tensor.dtype == DType::bf16) {
    std::vector<std::uint16_t> bits(out.size());
    backend.copy_to_host(bits.data(), tensor);
    std::transform(bits.begin(), bits.end(), out.begin(), [](std::uint16_t b) { return Out(bf16_to_float(b)); });
  } else if (tensor.dtype == DType::f32) {
    std::vector<float> narrow(out.size());
    backend.copy_to_host(narrow.data(), tensor);
    std::copy(narrow.begin(), narrow.end(), out.begin());
  } else {
    tensor.check_dtype(DType::f64);
    std::vector<double> wide(out.size());
    backend.copy_to_host(wide.data(), tensor);
    std::transform(wide.begin(), wide.end(), out.begin(), [](double x) { return static_cast<Out>(x); });
  }
  return out;
}

}  // namespace

std::vector<float> tensor_to_host_f32(Backend& backend, const Tensor& tensor) { return to_host<float>(backend, tensor); }
std::vector<double> tensor_to_host_f64(Backend& backend, const Tensor& tensor) { return to_host<double>(backend, tensor); }

void tensor_from_host_f32(Backend& backend, const Tensor& tensor, std::span<const float> values) {
  if (values.size() != static_cast<std::size_t>(tensor.numel()))
    throw std::invalid_argument(
        fmt::format("expected {} values for tensor {}, got {}", tensor.numel(), shape_string(tensor.shape), values.size()));
  if (tensor.dtype == DType::f32) {
    backend.copy_from_host(tensor, values.data());
  } else {
    tensor.check_dtype(DType::f64);
    std::vector<double> wide(values.begin(), values.end());
    backend.copy_from_host(tensor, wide.data());
  }
}

}  // namespace pope
