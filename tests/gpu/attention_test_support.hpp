// Shared by the GPU attention tests (test_cuda_attention.cpp against the CPU reference,
// test_cudnn_attention.cpp cuDNN against the fused kernels): device buffers that poison their
// bytes with NaN, random inputs exactly representable in bf16, one attention problem (encoding,
// shape, qkv, dout, position parameters) and its forward + backward on the GPU, and the relative
// error ‖actual − expected‖ / ‖expected‖.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_attention.hpp"
#include "cuda/cuda_check.hpp"
#include "pope/backend.hpp"
#include "pope/config.hpp"
#include "pope/position.hpp"
#include "position/encodings.hpp"

namespace pope::attention_test {

// ---------------------------------------------------------------- device memory helpers

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) { POPE_CUDA_CHECK(cudaMalloc(&data_, bytes)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }

  Tensor tensor(DType dtype, Shape shape) const { return Tensor{data_, dtype, DeviceKind::cuda, std::move(shape)}; }
  // All bytes 0xFF: NaN in f32 and bf16.
  void poison() { POPE_CUDA_CHECK(cudaMemset(data_, 0xFF, bytes_)); }
  void upload(const void* host) { POPE_CUDA_CHECK(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice)); }
  void download(void* host) const { POPE_CUDA_CHECK(cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost)); }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& values) {
  std::vector<__nv_bfloat16> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = __float2bfloat16(values[i]);
  return out;
}

inline std::vector<float> from_bf16(const std::vector<__nv_bfloat16>& values) {
  std::vector<float> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = __bfloat162float(values[i]);
  return out;
}

// Uniform values in [low, high), rounded to bf16 so that GPU and CPU see the same numbers.
inline std::vector<float> random_bf16_values(std::size_t count, float low, float high, std::mt19937& engine) {
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(count);
  for (float& v : values) v = __bfloat162float(__float2bfloat16(uniform(engine)));
  return values;
}

inline Tensor host_tensor(std::vector<float>& values, Shape shape) {
  return Tensor{values.data(), DType::f32, DeviceKind::cpu, std::move(shape)};
}

// ‖actual − expected‖ / ‖expected‖ over elements [begin, end) of every `stride`-long row
// (stride 0: the whole vector); ‖actual − expected‖ itself when the reference is exactly zero
// (e.g. dq at T = 1, where dP − D cancels). NaN anywhere makes the result NaN, which fails any bound.
inline double relative_error(const std::vector<float>& actual, const std::vector<float>& expected, std::size_t stride = 0,
                      std::size_t begin = 0, std::size_t end = 0) {
  double diff = 0.0, norm = 0.0;
  const std::size_t row = stride == 0 ? expected.size() : stride;
  const std::size_t first = stride == 0 ? 0 : begin, last = stride == 0 ? expected.size() : end;
  for (std::size_t r = 0; r < expected.size(); r += row)
    for (std::size_t i = r + first; i < r + last; ++i) {
      const double e = expected[i], a = actual[i];
      diff += (a - e) * (a - e);
      norm += e * e;
    }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

inline std::size_t count_non_finite(const std::vector<float>& values) {
  std::size_t count = 0;
  for (float v : values) count += !std::isfinite(v);
  return count;
}

// ---------------------------------------------------------------- problems

struct EncodingCase {
  std::string name;
  std::function<std::unique_ptr<PositionEncoding>()> make;
  bool some_delta_out_of_range = false;  // PoPE: put some δ outside [−2π, 0]
  int train_length = 1024;
  int position_offset = 0;
};

// The whole-model factory's encoding for a model.position.kind (for the composed PJ methods).
inline EncodingCase case_of_kind(const std::string& kind, int n_head, int head_dim) {
  ModelConfig model;
  model.n_head = n_head;
  model.n_embd = n_head * head_dim;
  model.position.kind = kind;
  return {kind, [model] { return make_position_encoding(model); }};
}

// gtest prints test parameters; the name says it all.
inline void PrintTo(const EncodingCase& c, std::ostream* os) { *os << c.name; }

// One attention call's inputs, as exact bf16 values held in float.
struct Problem {
  std::unique_ptr<PositionEncoding> encoding;
  AttentionShape shape;
  PositionContext ctx;
  std::vector<float> qkv, dout;
  std::vector<std::vector<float>> params, initial_grads;

  std::int64_t rows() const { return std::int64_t(shape.batch) * shape.seq_len; }
  std::int64_t channels() const { return std::int64_t(shape.n_head) * shape.head_dim; }
  std::int64_t statistics() const { return std::int64_t(shape.batch) * shape.n_head * shape.seq_len; }
};

inline Problem make_problem(const EncodingCase& c, int batch, int seq_len, int n_head, int head_dim, unsigned seed) {
  std::mt19937 engine(seed);
  Problem p;
  p.encoding = c.make();
  p.shape = {batch, seq_len, n_head, head_dim};
  p.ctx.seq_len = seq_len;
  p.ctx.train_length = c.train_length;
  p.ctx.n_head = n_head;
  p.ctx.head_dim = head_dim;
  p.ctx.position_offset = c.position_offset;
  p.qkv = random_bf16_values(std::size_t(p.rows() * 3 * p.channels()), -1.5f, 1.5f, engine);
  p.dout = random_bf16_values(std::size_t(p.rows() * p.channels()), -1.0f, 1.0f, engine);
  constexpr float kTwoPi = 6.2831853f;
  for (const ParamSpec& spec : p.encoding->layer_parameters(n_head, head_dim)) {
    const std::size_t numel = std::size_t(shape_numel(spec.shape));
    std::vector<float> values = random_bf16_values(numel, -kTwoPi, 0.0f, engine);
    if (c.some_delta_out_of_range)
      for (std::size_t i = 0; i < numel; i += 5) values[i] = (i / 5) % 2 == 0 ? 0.75f : -7.5f;
    p.params.push_back(std::move(values));
    p.initial_grads.push_back(random_bf16_values(numel, -0.5f, 0.5f, engine));
  }
  return p;
}

// What one attention forward + backward produced, copied to the host.
struct Result {
  std::vector<float> out, lse, dqkv;
  std::vector<std::vector<float>> grads;
};

// Forward, then backward from the forward's own out and lse, on the GPU; with keep_encoded the
// forward keeps q̃, k̃ in a buffer of the caller's that the backward reads (the model's way).
// `impl` computes the attention of both (AttentionForward::impl).
inline Result run_on_gpu(cuda::AttentionRunner& runner, const Problem& p, bool keep_encoded = false,
                         AttentionImpl impl = AttentionImpl::fused) {
  const Shape qkv_shape{p.rows(), 3 * p.channels()}, out_shape{p.rows(), p.channels()};
  const Shape lse_shape{p.shape.batch, p.shape.n_head, p.shape.seq_len};
  DeviceBuffer qkv(p.qkv.size() * 2), dout(p.dout.size() * 2), out(p.dout.size() * 2), dqkv(p.qkv.size() * 2);
  DeviceBuffer lse(std::size_t(p.statistics()) * 4);
  qkv.upload(to_bf16(p.qkv).data());
  dout.upload(to_bf16(p.dout).data());
  std::vector<std::unique_ptr<DeviceBuffer>> param_buffers, grad_buffers;
  std::vector<Tensor> params, grads;
  for (std::size_t i = 0; i < p.params.size(); ++i) {
    const Shape shape{std::int64_t(p.params[i].size())};
    param_buffers.push_back(std::make_unique<DeviceBuffer>(p.params[i].size() * 4));
    param_buffers.back()->upload(p.params[i].data());
    params.push_back(param_buffers.back()->tensor(DType::f32, shape));
    grad_buffers.push_back(std::make_unique<DeviceBuffer>(p.initial_grads[i].size() * 4));
    grad_buffers.back()->upload(p.initial_grads[i].data());
    grads.push_back(grad_buffers.back()->tensor(DType::f32, shape));
  }
  out.poison();
  lse.poison();
  dqkv.poison();
  const std::int64_t encoded_numel = keep_encoded ? cuda::AttentionRunner::encoded_numel(p.shape, *p.encoding) : 0;
  DeviceBuffer encoded(std::size_t(encoded_numel) * 2 + 2);
  encoded.poison();

  AttentionForward forward;
  forward.shape = p.shape;
  forward.encoding = p.encoding.get();
  forward.position = p.ctx;
  forward.qkv = qkv.tensor(DType::bf16, qkv_shape);
  forward.out = out.tensor(DType::bf16, out_shape);
  forward.lse = lse.tensor(DType::f32, lse_shape);
  forward.position_params = params;
  if (keep_encoded) forward.encoded = encoded.tensor(DType::bf16, {encoded_numel});
  forward.impl = impl;
  runner.forward(forward, nullptr);

  AttentionBackward backward;
  backward.shape = p.shape;
  backward.encoding = p.encoding.get();
  backward.position = p.ctx;
  backward.qkv = forward.qkv;
  backward.out = forward.out;
  backward.lse = forward.lse;
  backward.dout = dout.tensor(DType::bf16, out_shape);
  backward.dqkv = dqkv.tensor(DType::bf16, qkv_shape);
  backward.position_params = params;
  backward.position_grads = grads;
  backward.encoded = forward.encoded;
  backward.impl = impl;
  runner.backward(backward, nullptr);
  POPE_CUDA_CHECK(cudaDeviceSynchronize());

  Result r;
  std::vector<__nv_bfloat16> staging(p.dout.size());
  out.download(staging.data());
  r.out = from_bf16(staging);
  r.lse.resize(std::size_t(p.statistics()));
  lse.download(r.lse.data());
  staging.resize(p.qkv.size());
  dqkv.download(staging.data());
  r.dqkv = from_bf16(staging);
  for (std::size_t i = 0; i < grad_buffers.size(); ++i) {
    r.grads.emplace_back(p.initial_grads[i].size());
    grad_buffers[i]->download(r.grads.back().data());
  }
  return r;
}

template <class Encoding, class Config>
inline std::function<std::unique_ptr<PositionEncoding>()> maker(Config config) {
  return [config] { return std::unique_ptr<PositionEncoding>(std::make_unique<Encoding>(config)); };
}

inline RopeConfig rope_with(double fraction, RopeScalingKind scaling, double factor) {
  RopeConfig config;
  config.fraction = fraction;
  config.scaling.kind = scaling;
  config.scaling.factor = factor;
  return config;
}

inline PopeConfig pope_with(MagnitudeKind magnitude, bool learn_delta, DeltaBound delta_bound = DeltaBound::clamp) {
  PopeConfig config;
  config.magnitude = magnitude;
  config.learn_delta = learn_delta;
  config.delta_bound = delta_bound;
  return config;
}

}  // namespace pope::attention_test
