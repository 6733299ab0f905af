// Warp- and block-wide reductions for the kernels. Every reduction has a fixed shape (a
// butterfly within each warp, then warp results in warp order), so a given block size
// always adds in the same order: results are bitwise reproducible from run to run.
#pragma once

#include <cuda_runtime.h>

namespace pope::kernels {

constexpr int kWarpSize = 32;

struct SumOp {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <class T> __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// The value of lane (this lane XOR offset). A struct type reduced by warp_reduce provides its
// own shuffle_xor overload beside it (found by argument-dependent lookup).
template <class T> __device__ T shuffle_xor(T value, int offset) { return __shfl_xor_sync(0xffffffffu, value, offset); }

// Combines `value` over the 32 lanes; every lane receives the same result (the butterfly
// adds the same pair in either order, and the operations used here are commutative).
template <class T, class Op> __device__ T warp_reduce(T value, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value = op(value, shuffle_xor(value, offset));
  return value;
}

// Combines `value` over the whole block (blockDim.x a multiple of 32, at most 1024); every
// thread receives the result. `shared` holds kWarpSize elements. All threads must call it.
template <class T, class Op> __device__ T block_reduce(T value, T* shared, Op op, T identity) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  value = warp_reduce(value, op);
  __syncthreads();  // a previous call's readers may still be reading `shared`
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : identity;
  return warp_reduce(value, op);
}

template <class T> __device__ T block_sum(T value, T* shared) { return block_reduce(value, shared, SumOp{}, T(0)); }

// Σ_{n < count} term(n) for this thread's column in a block of kWarpSize columns × kSlices
// slices (threadIdx.x, threadIdx.y): slice y adds the terms n = y, y + kSlices, … in order, then
// the slices are added in order, so the order is fixed (bitwise reproducible) while kSlices of a
// column's loads are in flight at once (one thread adding a long sum alone waits on each load).
// The total is returned to slice 0 (the other slices get 0). All threads of the block must call
// it, once per kernel.
template <int kSlices, class Term> __device__ float sliced_column_sum(int count, Term term) {
  __shared__ float slice_sums[kSlices][kWarpSize + 1];
  float sum = 0.0f;
  for (int n = int(threadIdx.y); n < count; n += kSlices) sum += term(n);
  slice_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.y == 0)
    for (int slice = 0; slice < kSlices; ++slice) total += slice_sums[slice][threadIdx.x];
  return total;
}

}  // namespace pope::kernels
