// One block per row. Pass 1 reads the row once, each thread keeping an online (max, sum of
// exp) pair over its columns; the pairs are combined across the block. Pass 2 (only for the
// gradient) reads the row again (from L2: a row is ~100 KB) and overwrites it with dlogits.
// Rows move in groups of 8 columns (16-byte accesses) when the padded width allows it. The
// kernel is written once over the logits' element type: bf16 for training (dlogits in place,
// half the memory), fp32 for evaluation (the classifier GEMM's fp32 product unrounded).
#include <math.h>

#include "bf16_group.cuh"
#include "block_reduce.cuh"
#include "cross_entropy.cuh"

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

template <class Logit, int kWidth>
__global__ void cross_entropy_kernel(float* losses, Logit* logits, const int* targets, int padded_width,
                                     int vocab_size, bool compute_grad, float grad_scale, DeviceErrorRecord* error) {
  using Group = VectorGroup<Logit, kWidth>;
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
  for (int g = threadIdx.x; g < real_groups; g += blockDim.x) {
    const Group values = load_group<kWidth>(z, g);
    for (int k = 0; k < kWidth; ++k) {
      if (g * kWidth + k >= vocab_size) break;
      const float value = values.get(k);
      if (value > partial.max) {
        partial.sum = partial.sum * expf(partial.max - value) + 1.0f;
        partial.max = value;
      } else {
        partial.sum += expf(value - partial.max);
      }
    }
  }
  const SoftmaxPartial total = block_reduce(partial, reduce_scratch, CombineSoftmax{}, SoftmaxPartial{-INFINITY, 0.0f});
  const float log_sum = logf(total.sum);
  if (threadIdx.x == 0) losses[row] = log_sum + total.max - target_logit;
  if (!compute_grad) return;

  const float shift = total.max + log_sum;  // probability = exp(z − shift)
  for (int g = threadIdx.x; g < all_groups; g += blockDim.x) {
    const Group values = load_group<kWidth>(z, g);
    Group gradients;
    for (int k = 0; k < kWidth; ++k) {
      const int c = g * kWidth + k;
      const float probability = c < vocab_size ? expf(values.get(k) - shift) : 0.0f;
      gradients.set(k, c < vocab_size ? (probability - (c == target ? 1.0f : 0.0f)) * grad_scale : 0.0f);
    }
    store_group(z, g, gradients);
  }
}

template <class Logit>
cudaError_t launch_cross_entropy(float* losses, Logit* logits, const int* targets, int rows, int padded_width,
                                 int vocab_size, bool compute_grad, float grad_scale, DeviceErrorRecord* error,
                                 cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch_with_group_width(padded_width, {logits}, [&](auto group) {
    cross_entropy_kernel<Logit, decltype(group)::value><<<rows, kThreads, 0, stream>>>(
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
