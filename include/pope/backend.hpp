// The op set both backends implement. The model (model.cpp) is written once as calls into
// these ops; the CPU backend is the readable reference (float, or double for gradient
// checks), the CUDA backend the fast path.
//
// Layout conventions (row-major, N = B·T rows, C = n_embd, H heads of width d = C/H):
//   activations  [N, C]; qkv [N, 3C] with q, k, v in column blocks of C and head h at h·d;
//   weights      [out_features, in_features] (a linear layer computes x·Wᵀ);
//   statistics   rstd [N], lse [B, H, T], losses [N] in the statistic dtype.
// Gradients marked "accumulate" are added to what the output tensor holds.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pope/position.hpp"
#include "pope/tensor.hpp"

namespace pope {

struct BackendDTypes {
  DType activation;  // activations and compute copies of weights (CPU: Real, CUDA: bf16)
  DType parameter;   // master weights, gradients, optimizer state (CPU: Real, CUDA: f32)
  DType statistic;   // rstd, lse, losses (CPU: Real, CUDA: f32)
};

// One attention call over a micro-batch. `position_params`/`position_grads` point at this
// layer's encoding parameters (one tensor per PositionEncoding::layer_parameters entry).
struct AttentionShape {
  int batch = 0;
  int seq_len = 0;
  int n_head = 0;
  int head_dim = 0;
};

struct AttentionForward {
  AttentionShape shape;
  const PositionEncoding* encoding = nullptr;
  PositionContext position;
  Tensor qkv;                     // [N, 3C]
  Tensor out;                     // [N, C]
  Tensor lse;                     // [B, H, T]; saved for the backward
  std::span<const Tensor> position_params;
};

struct AttentionBackward {
  AttentionShape shape;
  const PositionEncoding* encoding = nullptr;
  PositionContext position;
  Tensor qkv, out, lse, dout;     // as saved by / given to the forward
  Tensor dqkv;                    // [N, 3C], overwritten
  std::span<const Tensor> position_params;
  std::span<const Tensor> position_grads;  // accumulate
};

// One contiguous run of the parameter arena with its weight-decay flag.
struct ParamSegment {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  bool weight_decay = false;
};

struct AdamWStep {
  double lr = 0.0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.0;
  long step = 1;              // 1-based, for bias correction
  double grad_scale = 1.0;    // multiplies the gradient first (clipping)
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind device() const = 0;
  virtual BackendDTypes dtypes() const = 0;
  virtual std::string description() const = 0;

  // Memory. allocate() returns zero-filled memory of at least `bytes`.
  virtual Buffer allocate(std::size_t bytes) = 0;
  virtual void fill(Tensor t, double value) = 0;
  virtual void copy(Tensor dst, Tensor src) = 0;     // same dtype and numel
  virtual void convert(Tensor dst, Tensor src) = 0;  // any float dtypes, same numel
  virtual void copy_from_host(Tensor dst, const void* src) = 0;
  virtual void copy_to_host(void* dst, Tensor src) = 0;
  virtual void synchronize() = 0;

  // out[N,C] = wte[tokens[n], :];  dwte[tokens[n], :] += dout[n, :] (accumulate, deterministic).
  virtual void embedding_forward(Tensor out, Tensor tokens, Tensor wte) = 0;
  virtual void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens) = 0;

  // out = x / rms(x) · gain, rstd = 1/sqrt(mean(x²) + eps);  dx, dgain accumulate.
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor gain, double eps) = 0;
  virtual void rmsnorm_backward(Tensor dx, Tensor dgain, Tensor dout, Tensor x, Tensor gain, Tensor rstd) = 0;

  // out = alpha · op(a) · op(b) + beta · out, 2-D tensors, op = transpose when the flag is set.
  virtual void matmul(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b,
                      double alpha = 1.0, double beta = 0.0) = 0;

  // GELU, tanh approximation. backward writes dx = dout · gelu'(x) (dx may alias dout).
  virtual void gelu_forward(Tensor out, Tensor x) = 0;
  virtual void gelu_backward(Tensor dx, Tensor dout, Tensor x) = 0;

  // out = a + b (out may alias a or b).
  virtual void add(Tensor out, Tensor a, Tensor b) = 0;

  // Causal attention with the encoding's transform, bias and scale.
  virtual void attention_forward(const AttentionForward& args) = 0;
  virtual void attention_backward(const AttentionBackward& args) = 0;

  // Softmax cross-entropy over the first `vocab_size` columns of logits [N, Vp] (padded
  // columns excluded). losses[n] = −log p(targets[n]); targets < 0 are masked (loss 0, no
  // gradient). With compute_grad, logits are overwritten by dL/dlogits · grad_scale
  // (padded columns 0).
  virtual void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int vocab_size,
                             bool compute_grad, double grad_scale) = 0;

  // Σ x² over a tensor (host value), for the global gradient norm.
  virtual double sum_of_squares(Tensor x) = 0;

  // AdamW over the whole arena: grads are multiplied by step.grad_scale, decoupled weight
  // decay on segments that ask for it; m, v same layout as params. If `compute_copy` is not
  // empty it receives the updated weights converted to the activation dtype.
  virtual void adamw(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                     const AdamWStep& step, Tensor compute_copy) = 0;
};

// Convenience: a tensor together with the buffer that owns it.
struct OwnedTensor {
  Buffer buffer;
  Tensor tensor;
};
OwnedTensor allocate_tensor(Backend& backend, Shape shape, DType dtype);

// Host copies of an f32 or f64 tensor (checkpoints store fp32; losses are read in double). Throws
// std::invalid_argument when the host span's size differs from the tensor's.
std::vector<float> tensor_to_host_f32(Backend& backend, const Tensor& tensor);
std::vector<double> tensor_to_host_f64(Backend& backend, const Tensor& tensor);
void tensor_from_host_f32(Backend& backend, const Tensor& tensor, std::span<const float> values);

// Backend factory: "cpu", "cuda" or "auto" (CUDA when a GPU is present, else CPU).
// precision "float" | "double" selects the CPU backend's Real. Throws std::runtime_error
// when CUDA is asked for but unavailable.
std::unique_ptr<Backend> make_backend(const std::string& device, const std::string& cpu_precision = "float",
                                      int threads = 0);
bool cuda_available();

}  // namespace pope
