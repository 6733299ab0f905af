// Causal attention on the GPU for every encoding: the host entry points that CudaBackend
// calls; device code lives in kernels/attention/.
//
// Dtypes (BackendDTypes of the CUDA backend): qkv, out, dout, dqkv are bf16 [N, 3C] / [N, C];
// lse is f32 [B, H, T]; position parameters and their gradients are f32 (master weights);
// the encoded q̃, k̃ in scratch are bf16, their gradients f32.
// All encoding math (rotations, PoPE magnitudes and phases, bias tables) is done in fp32.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "pope/backend.hpp"

namespace pope::cuda {

class AttentionRunner {
 public:
  AttentionRunner();
  ~AttentionRunner();
  AttentionRunner(const AttentionRunner&) = delete;
  AttentionRunner& operator=(const AttentionRunner&) = delete;

  // Scratch memory grows on first use of a larger shape and is then reused, so repeated
  // steps of one shape allocate nothing.
  void forward(const AttentionForward& args, cudaStream_t stream);
  // bias_table_grad (optional, f32 [n_head, seq_len] on the device): ACCUMULATES the gradient
  // of the call's score-bias table b_h(Δ), Ĝ_h(Δ) = Σ_b Σ_{t−s=Δ} dS_ts, for an encoding whose
  // bias comes from learnable parameters (PJ-bias: its device-built table). Fused path only.
  void backward(const AttentionBackward& args, cudaStream_t stream, float* bias_table_grad = nullptr);
  // Backend::attention_decode: the new rows encoded as the forward encodes them, appended to the
  // cache, then the decode kernels (kernels/attention/decode_attention.cuh).
  void decode(const AttentionDecode& args, cudaStream_t stream);
  // Device memory this runner holds now (its scratch and tables), for memory accounting.
  std::size_t scratch_bytes() const;
  // bf16 elements of AttentionForward::encoded for a call of this shape: q̃ and k̃, [B, H, T, W]
  // each (W = the encoding's q/k width), then for a PJ-bias its f32 [H, T] table (two elements
  // per float). With it the backward skips re-encoding and re-tabulating.
  static std::int64_t encoded_numel(const AttentionShape& shape, const PositionEncoding& encoding);

 private:
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace pope::cuda
