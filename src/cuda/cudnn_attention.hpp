// cuDNN's fused causal SDPA (flash attention, cuDNN 9 graph API) on our encoded q̃, k̃ and
// the v of qkv: attention.impl = cudnn, a comparator for the fused kernels of
// kernels/attention/. AttentionRunner calls it between our q/k transform and its backward,
// so every encoding without a score bias runs through it unchanged.
//
// Layouts (the same as the fused kernels'): q̃, k̃ bf16 [B, H, T, W] contiguous; v read in
// place from qkv bf16 [B·T, 3C] (head h at column 2C + h·d); out bf16 [B·T, C]; lse f32
// [B, H, T], the natural log of each row's softmax sum (cuDNN's "Stats"). The backward writes
// dq̃, dk̃ f32 [B, H, T, W] (cuDNN's bf16 results widened; dq̃'s f32 accumulator is zeroed scratch),
// dv bf16 into dqkv in place, and uses row_dot f32 [B, H, T] as its rowsum(dout ∘ out).
//
// One forward and one backward plan per shape (B, H, T, W, d) are built on first use
// (cuDNN compiles its kernels then: seconds) and cached with their workspace, so repeated
// calls of a shape allocate no device memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>

#include "attention/attention_params.cuh"
#include "cuda/device_scratch.hpp"

namespace pope::cuda {

namespace cudnn {
class ExecutionPlan;
}

struct CudnnAttentionForward {
  const __nv_bfloat16* q = nullptr;    // q̃
  const __nv_bfloat16* k = nullptr;    // k̃
  const __nv_bfloat16* qkv = nullptr;  // v at column 2C
  float scale = 1.0f;
  __nv_bfloat16* out = nullptr;
  float* lse = nullptr;
};

struct CudnnAttentionBackward {
  const __nv_bfloat16* q = nullptr;    // the forward's inputs
  const __nv_bfloat16* k = nullptr;
  const __nv_bfloat16* qkv = nullptr;
  float scale = 1.0f;
  const __nv_bfloat16* out = nullptr;  // as a forward (of either impl) wrote them
  const float* lse = nullptr;
  const __nv_bfloat16* dout = nullptr;
  float* row_dot = nullptr;        // [B, H, T] scratch
  float* dq = nullptr;             // f32 [B, H, T, W]
  float* dk = nullptr;             // f32 [B, H, T, W]
  __nv_bfloat16* dqkv = nullptr;   // dv written at column 2C; q and k columns untouched
};

class CudnnAttention {
 public:
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Throws std::runtime_error for shapes cuDNN's SDPA does not take (head dims not multiples of
  // 8, q/k rows wider than 256, misaligned pointers) and, with cuDNN's own message, for
  // graphs no engine supports.
  void forward(const kernels::AttentionDims& dims, const CudnnAttentionForward& args, cudaStream_t stream);
  void backward(const kernels::AttentionDims& dims, const CudnnAttentionBackward& args, cudaStream_t stream);
  // Device memory held: the workspaces and the backward's bf16 dq̃, dk̃ staging.
  std::size_t scratch_bytes() const;

 private:
  using ShapeKey = std::tuple<int, int, int, int, int>;  // B, H, T, W, d
  struct Plans;
  Plans& plans_for(const kernels::AttentionDims& dims);

  struct Handle;
  std::unique_ptr<Handle> handle_;
  std::map<ShapeKey, std::unique_ptr<Plans>> plans_;
  DeviceScratch workspace_, dq_accumulator_, dq_bf16_, dk_bf16_;
};

}  // namespace pope::cuda
