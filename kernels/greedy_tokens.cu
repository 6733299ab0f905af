// One block per row; each thread keeps the best (logit, column) of its columns and an online
// Σ 2^((z − best)·log2 e) rescaled when its best grows, then the block combines them (ties to the
// lower column, so the choice is the host argmax's: the first of the largest).
#include <climits>
#include <math.h>

#include "block_reduce.cuh"
#include "dependent_launch.cuh"
#include "greedy_tokens.cuh"
#include "log2_units.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 1024;

struct Choice {
  float best;  // largest finite logit seen, −∞ before any
  int id;      // its column (the lowest among equals), INT_MAX before any
  float sum;   // Σ 2^((z − best)·log2 e) over the columns seen
  int bad;     // a non-finite logit was seen
};

struct CombineChoices {
  __device__ Choice operator()(Choice a, Choice b) const {
    const int bad = a.bad | b.bad;
    if (a.best == -INFINITY && b.best == -INFINITY) return {-INFINITY, INT_MAX, 0.0f, bad};
    const float best = fmaxf(a.best, b.best);
    const int id = a.best == b.best ? min(a.id, b.id) : (a.best > b.best ? a.id : b.id);
    return {best, id, a.sum * exp2f((a.best - best) * kLog2e) + b.sum * exp2f((b.best - best) * kLog2e), bad};
  }
};

__device__ Choice shuffle_xor(Choice value, int offset) {
  return {__shfl_xor_sync(0xffffffffu, value.best, offset), __shfl_xor_sync(0xffffffffu, value.id, offset),
          __shfl_xor_sync(0xffffffffu, value.sum, offset), __shfl_xor_sync(0xffffffffu, value.bad, offset)};
}

__global__ void __launch_bounds__(kThreads)
    greedy_kernel(int* ids, float* log_probs, const float* logits, int padded_width, int vocab_size, int* past,
                  int advance) {
  __shared__ Choice shared[kWarpSize];
  allow_dependents();
  wait_for_producer();
  const int row = blockIdx.x;
  const float* z = logits + long(row) * padded_width;
  Choice mine{-INFINITY, INT_MAX, 0.0f, 0};
  for (int j = threadIdx.x; j < vocab_size; j += blockDim.x) {
    const float x = z[j];
    if (!isfinite(x)) {
      mine.bad = 1;
    } else if (x > mine.best) {
      mine.sum = mine.sum * exp2f((mine.best - x) * kLog2e) + 1.0f;
      mine.best = x;
      mine.id = j;
    } else {
      mine.sum += exp2f((x - mine.best) * kLog2e);
    }
  }
  const Choice all = block_reduce(mine, shared, CombineChoices{}, Choice{-INFINITY, INT_MAX, 0.0f, 0});
  if (threadIdx.x != 0) return;
  if (past != nullptr && row == 0) *past += advance;
  const bool refused = all.bad != 0 || all.id == INT_MAX;
  ids[row] = refused ? 0 : all.id;
  log_probs[row] = refused ? NAN : -logf(all.sum);
}

}  // namespace

cudaError_t greedy_tokens(int* ids, float* log_probs, const float* logits, int rows, int padded_width, int vocab_size,
                          int* past, int advance, cudaStream_t stream) {
  if (rows <= 0 || vocab_size <= 0 || vocab_size > padded_width) return cudaErrorInvalidValue;
  return launch_dependent(greedy_kernel, dim3(unsigned(rows)), dim3(kThreads), stream, ids, log_probs, logits,
                          padded_width, vocab_size, past, advance);
}

}  // namespace pope::kernels
