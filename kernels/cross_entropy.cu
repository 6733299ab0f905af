// One block per row. Pass 1 reads the row once, each thread keeping an online (max, sum of
// exp) pair over its columns, rescaled once per group of columns; the pairs are combined across
// the block. Pass 2 (only for the gradient) overwrites the row with dlogits, reading it again
// from shared memory where pass 1 left a copy (a GPT-2 row of bf16 logits is 100 KB: two blocks
// per multiprocessor), else from global memory (L2). Rows move in groups of 8 columns (16-byte
// accesses) when the padded width allows it. The kernel is written once over the logits'
// element type: bf16 for training (dlogits in place, half the memory), fp32 for evaluation (the
// classifier GEMM's fp32 product unrounded).
#include <math.h>

#include "bf16_group.cuh"
#include "block_reduce.cuh"
#include "cross_entropy.cuh"
#include "kernel_launch.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 512;

// Σ exp(z − max) over some columns, with its max: combining two rescales to the larger max.
struct SoftmaxPartial {
  float max;
  float sum;
};

struct CombineSoftmax {
  __device__ SoftmaxPartial operator()(SoftmaxPartial a, SoftmaxPartial b) const {
    const float max = fmaxf(a.max, b.max);
    if (max == -INFINITY) return {max, 0.0f};
    return {max, a.sum * expf(a.max - max) + b.sum * expf(b.max - max)};
  }
};

__device__ SoftmaxPartial shuffle_xor(SoftmaxPartial value, int offset) {
  return {kernels::shuffle_xor(value.max, offset), kernels::shuffle_xor(value.sum, offset)};
}

constexpr float kLog2e = 1.4426950408889634f;

// exp(value − max) for a finite max (exp2 of a product: one FFMA and ex2).
__device__ inline float exp_below(float value, float max) { return exp2f((value - max) * kLog2e); }

// Adds the first `count` values of a group to a thread's softmax partial: the group's max first,
// then one rescale of the running sum.
template <class Group>
__device__ inline void add_group(SoftmaxPartial& partial, const Group& values, int count) {
  float group_max = -INFINITY;
  for (int k = 0; k < count; ++k) group_max = fmaxf(group_max, values.get(k));
  if (group_max == -INFINITY) return;  // nothing but −∞: adds 0
  const float max = fmaxf(partial.max, group_max);
  float sum = partial.max == -INFINITY ? 0.0f : partial.sum * exp_below(partial.max, max);
  for (int k = 0; k < count; ++k) sum += exp_below(values.get(k), max);
  partial = {max, sum};
}

// kCacheRow: pass 1 copies the row's real groups into dynamic shared memory for pass 2.
template <class Logit, int kWidth, bool kCacheRow>
__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(float* losses, Logit* logits, const int* targets,
                                                                 int padded_width, int vocab_size, bool compute_grad,
                                                                 float grad_scale, DeviceErrorRecord* error) {
  using Group = VectorGroup<Logit, kWidth>;
  extern __shared__ __align__(16) unsigned char row_cache_bytes[];
  Group* row_cache = reinterpret_cast<Group*>(row_cache_bytes);
  __shared__ SoftmaxPartial reduce_scratch[kWarpSize];
  const int row = blockIdx.x;
  Logit* z = logits + std::size_t(row) * padded_width;
  const int target = targets[row];
  const int all_groups = padded_width / kWidth;
  if (target >= vocab_size) {
    if (threadIdx.x == 0) {
      report_device_error(error, kCrossEntropyTarget, row, target, vocab_size);
      losses[row] = NAN;
    }
    return;
  }
  if (target < 0) {  // masked: no loss, no gradient
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (compute_grad)
      for (int g = threadIdx.x; g < all_groups; g += blockDim.x) store_group(z, g, Group{});
    return;
  }
  // Read before the block reduction's barriers; pass 2 may overwrite z[target].
  const float target_logit = load_group<1>(z, std::size_t(target)).get(0);

  // Groups holding real columns; the last one may reach into the padding, which is skipped.
  const int real_groups = (vocab_size + kWidth - 1) / kWidth;
  SoftmaxPartial partial{-INFINITY, 0.0f};
#pragma unroll 4
  for (int g = threadIdx.x; g < real_groups; g += blockDim.x) {
    const Group values = load_group<kWidth>(z, g);
    if constexpr (kCacheRow) row_cache[g] = values;
    add_group(partial, values, min(kWidth, vocab_size - g * kWidth));
  }
  const SoftmaxPartial total = block_reduce(partial, reduce_scratch, CombineSoftmax{}, SoftmaxPartial{-INFINITY, 0.0f});
  const float log_sum = logf(total.sum);
  if (threadIdx.x == 0) losses[row] = log_sum + total.max - target_logit;
  if (!compute_grad) return;

  // probability = exp(z − shift); block_reduce's barriers ordered the cache's writes before
  // these reads.
  const float shift = total.max + log_sum;
#pragma unroll 4
  for (int g = threadIdx.x; g < all_groups; g += blockDim.x) {
    Group gradients{};  // padding columns: 0
    if (g < real_groups) {
      const Group values = kCacheRow ? row_cache[g] : load_group<kWidth>(z, g);
      for (int k = 0; k < kWidth; ++k) {
        const int c = g * kWidth + k;
        if (c < vocab_size) gradients.set(k, (exp_below(values.get(k), shift) - (c == target ? 1.0f : 0.0f)) * grad_scale);
      }
    }
    store_group(z, g, gradients);
  }
}

// Rows whose real groups take at most this much shared memory are cached for pass 2 (two
// blocks per multiprocessor keep a 50,304-column bf16 row each).
constexpr std::size_t kMaxCachedRowBytes = 112u << 10;

template <class Logit>
cudaError_t launch_cross_entropy(float* losses, Logit* logits, const int* targets, int rows, int padded_width,
                                 int vocab_size, bool compute_grad, float grad_scale, DeviceErrorRecord* error,
                                 cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch_with_group_width(padded_width, {logits}, [&](auto group) {
    constexpr int kWidth = decltype(group)::value;
    const std::size_t row_bytes = std::size_t((vocab_size + kWidth - 1) / kWidth) * sizeof(VectorGroup<Logit, kWidth>);
    if (compute_grad && row_bytes <= kMaxCachedRowBytes)
      return launch_with_shared<cross_entropy_kernel<Logit, kWidth, true>>(
          dim3(unsigned(rows)), kThreads, row_bytes, stream, losses, logits, targets, padded_width, vocab_size,
          compute_grad, grad_scale, error);
    cross_entropy_kernel<Logit, kWidth, false><<<rows, kThreads, 0, stream>>>(
        losses, logits, targets, padded_width, vocab_size, compute_grad, grad_scale, error);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t cross_entropy(float* losses, __nv_bfloat16* logits, const int* targets, int rows, int padded_width,
                          int vocab_size, bool compute_grad, float grad_scale, DeviceErrorRecord* error,
                          cudaStream_t stream) {
  return launch_cross_entropy(losses, logits, targets, rows, padded_width, vocab_size, compute_grad, grad_scale, error,
                              stream);
}

cudaError_t cross_entropy(float* losses, float* logits, const int* targets, int rows, int padded_width, int vocab_size,
                          bool compute_grad, float grad_scale, DeviceErrorRecord* error, cudaStream_t stream) {
  return launch_cross_entropy(losses, logits, targets, rows, padded_width, vocab_size, compute_grad, grad_scale, error,
                              stream);
}

}  // namespace pope::kernels
