// One block per row, reading the row in 16-byte loads where it is aligned. Each thread keeps the
// best (logit, column) of its columns and an online Σ 2^((z − best)·log2 e), rescaled when its best
// grows; then the block combines them (ties to the lower column, so the choice is the host
// argmax's: the first of the largest).
#include <climits>
#include <cstdint>
#include <math.h>

#include "block_reduce.cuh"
#include "dependent_launch.cuh"
#include "greedy_tokens.cuh"
#include "log2_units.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 1024;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread

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
  auto consider = [&](float x, int j) {
    if (!isfinite(x)) {
      mine.bad = 1;
    } else if (x > mine.best) {
      mine.sum = mine.sum * exp2f((mine.best - x) * kLog2e) + 1.0f;
      mine.best = x;
      mine.id = j;
    } else {
      mine.sum += exp2f((x - mine.best) * kLog2e);
    }
  };
  if (padded_width % 4 == 0 && reinterpret_cast<std::uintptr_t>(logits) % 16 == 0) {
    // 16-byte loads, kUnroll of them in flight per thread; each thread's columns in increasing order.
    const float4* z4 = reinterpret_cast<const float4*>(z);
    const int groups = (vocab_size + 3) / 4;
    for (int g0 = threadIdx.x; g0 < groups; g0 += kThreads * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int g = g0 + u * kThreads;
        v[u] = g < groups ? z4[g] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = 4 * (g0 + u * kThreads);
        if (j >= vocab_size) break;
        consider(v[u].x, j);
        if (j + 1 < vocab_size) consider(v[u].y, j + 1);
        if (j + 2 < vocab_size) consider(v[u].z, j + 2);
        if (j + 3 < vocab_size) consider(v[u].w, j + 3);
      }
    }
  } else {
    for (int j = threadIdx.x; j < vocab_size; j += kThreads) consider(z[j], j);
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
