// Tensor-core building blocks of the fused attention kernels (flash_attention.cu), sm_80 and
// later: cp.async copies of bf16 row tiles into padded shared memory, ldmatrix fragment loads,
// mma.sync m16n8k16 (bf16 in, f32 accumulate), and the register re-packing that turns an f32
// accumulator tile into the next product's bf16 A operand.
//
// Fragment layouts of mma.m16n8k16 (lane = 4·g + q, g = lane / 4, q = lane % 4):
//   A 16×16 (row major), 4 registers of 2 bf16: (g, 2q..2q+1), (g+8, 2q..), (g, 2q+8..), (g+8, 2q+8..)
//   B 16×8  (k × n),     2 registers:           (k = 2q..2q+1, n = g), (k = 2q+8.., n = g)
//   C 16×8  (f32),       4 floats:              (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1)
// So an accumulator tile over 16 columns (two C fragments) is, re-packed, exactly the A
// fragment of a product that sums over those 16 columns (flash attention's P·V trick).
//
// Shared tiles hold `rows` rows of kWidth bf16 with a row stride of kWidth + 8 elements: every
// row starts 16 bytes past a multiple of 128, so the 8 row addresses of one ldmatrix 8×8
// matrix fall in 8 distinct 16-byte bank groups (no bank conflicts) for kWidth 64 and 128.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "block_reduce.cuh"  // kWarpSize

namespace pope::kernels::mma_tiles {


__host__ __device__ constexpr int padded_stride(int width) { return width + 8; }

__device__ inline std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global → shared, asynchronously; zero-filled when !valid (rows past the sequence),
// in which case `source` is not read but must still be a valid address.
__device__ inline void copy_async_16(void* destination, const void* source, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(destination)), "l"(source),
               "r"(valid ? 16 : 0));
}

// 4 bytes global → shared, asynchronously; zero-filled when !valid.
__device__ inline void copy_async_4(void* destination, const void* source, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(destination)), "l"(source),
               "r"(valid ? 4 : 0));
}

__device__ inline void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending>
__device__ inline void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The double-buffered loop of the flash kernels: for b in [first, end), block b's tiles sit in
// shared stage (b − first) & 1 while block b + 1 loads into the other one. load(b, stage) queues
// block b's copies and commits them as one group; the caller has already queued block `first`
// into stage 0. body(b, stage) runs once block b has arrived for the whole CTA, and no stage is
// overwritten before every thread is done with it. All threads of the block call this.
// kAsyncProxyReads (sm_90): the body reads the tiles with wgmma, so each thread's copies are
// made visible to the async proxy before the barrier.
template <bool kAsyncProxyReads = false, class Load, class Body>
__device__ __forceinline__ void for_each_double_buffered(int first, int end, Load&& load, Body&& body) {
  for (int b = first; b < end; ++b) {
    const int stage = (b - first) & 1;
    if (b + 1 < end) {
      load(b + 1, stage ^ 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    if constexpr (kAsyncProxyReads) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    body(b, stage);
    __syncthreads();  // the next iteration's loads overwrite this stage
  }
}

// All threads of the block: rows [first, first + rows) of a bf16 matrix (row r at
// source + r·source_stride, kWidth columns) into a padded shared tile; rows ≥ count become zeros.
template <int kWidth>
__device__ void load_tile_async(__nv_bfloat16* tile, const __nv_bfloat16* source, std::int64_t source_stride,
                                int first, int rows, int count) {
  constexpr int kChunks = kWidth / 8;  // 16-byte pieces per row
  for (int i = int(threadIdx.x); i < rows * kChunks; i += int(blockDim.x)) {
    const int r = i / kChunks, c = (i % kChunks) * 8, row = first + r;
    const bool valid = row < count;
    const __nv_bfloat16* from = valid ? source + std::int64_t(row) * source_stride + c : source;
    copy_async_16(tile + r * padded_stride(kWidth) + c, from, valid);
  }
}

// Four 8×8 bf16 matrices; lane i gives the row address of matrix i / 8, row i % 8.
__device__ inline void load_matrix_x4(std::uint32_t (&r)[4], const __nv_bfloat16* address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(address)));
}

// The same, each matrix transposed.
__device__ inline void load_matrix_x4_transposed(std::uint32_t (&r)[4], const __nv_bfloat16* address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(address)));
}

// c += a · b for one 16×8 tile.
__device__ inline void mma_bf16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16 in one register, `low` in the low half (the lower column of a fragment).
__device__ inline std::uint32_t pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const std::uint32_t*>(&pair);
}

// A operand of 16 rows × 16 columns from accumulator fragments c[2j] and c[2j+1] (columns
// 16j..16j+7 and 16j+8..16j+15).
__device__ inline void accumulators_to_a(std::uint32_t (&a)[4], const float (&left)[4], const float (&right)[4]) {
  a[0] = pack_bf16(left[0], left[1]);
  a[1] = pack_bf16(left[2], left[3]);
  a[2] = pack_bf16(right[0], right[1]);
  a[3] = pack_bf16(right[2], right[3]);
}

// ldmatrix addresses for one warp, given a padded tile of kWidth columns:
//   a_operand: the A fragment of rows [row0, row0 + 16) × columns [col0, col0 + 16) of a
//              row-major tile (the product's rows are the tile's rows).
//   b_rows:    two B fragments (n-blocks n0 and n0 + 8) of k-step [k0, k0 + 16) where the
//              tile stores B transposed, row n holding B[·][n] (keys for Q·Kᵀ): non-transposed load.
//   b_columns: two B fragments (n-blocks n0, n0 + 8) of k-step [k0, k0 + 16) where the tile
//              stores B as is, row k holding B[k][·] (values for P·V): transposed load.
//   a_columns: the A fragment of product rows [m0, m0 + 16) × k-step [k0, k0 + 16) where the
//              tile stores A transposed, row k holding A[·][k] (dS kept key-major for dq̃ =
//              dS·k̃): transposed load, its four 8×8 matrices in the A register order.
template <int kWidth>
__device__ inline const __nv_bfloat16* a_operand(const __nv_bfloat16* tile, int row0, int col0) {
  const int lane = int(threadIdx.x) % kWarpSize;
  return tile + (row0 + lane % 16) * padded_stride(kWidth) + col0 + (lane / 16) * 8;
}
template <int kWidth>
__device__ inline const __nv_bfloat16* b_rows(const __nv_bfloat16* tile, int n0, int k0) {
  const int lane = int(threadIdx.x) % kWarpSize;
  return tile + (n0 + lane % 8 + (lane / 16) * 8) * padded_stride(kWidth) + k0 + ((lane / 8) % 2) * 8;
}
template <int kWidth>
__device__ inline const __nv_bfloat16* b_columns(const __nv_bfloat16* tile, int k0, int n0) {
  const int lane = int(threadIdx.x) % kWarpSize;
  return tile + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * padded_stride(kWidth) + n0 + (lane / 16) * 8;
}

template <int kWidth>
__device__ inline const __nv_bfloat16* a_columns(const __nv_bfloat16* tile, int m0, int k0) {
  const int lane = int(threadIdx.x) % kWarpSize;
  return tile + (k0 + lane % 8 + (lane / 16) * 8) * padded_stride(kWidth) + m0 + ((lane / 8) % 2) * 8;
}

// acc[n-block] += a · B over one 16-deep step for the kN output columns: load_b(b, n0) fetches
// B's fragments of columns n0..n0+15 (two 8-column blocks). The inner loop of the products below.
template <int kN, class LoadB>
__device__ inline void mma_step(float (&acc)[kN / 8][4], const std::uint32_t (&a)[4], LoadB&& load_b) {
#pragma unroll
  for (int n0 = 0; n0 < kN; n0 += 16) {
    std::uint32_t b[4];
    load_b(b, n0);
    mma_bf16(acc[n0 / 8], a, b[0], b[1]);
    mma_bf16(acc[n0 / 8 + 1], a, b[2], b[3]);
  }
}

// acc[n-block] += A · B over kDepth columns, A from a row-major shared tile (rows row0..+16),
// B from a tile that stores it transposed (row n = column n of B), kN columns of output:
// S = Q·Kᵀ and friends.
template <int kDepth, int kN, int kAStride, int kBStride>
__device__ inline void mma_a_tile_b_rows(float (&acc)[kN / 8][4], const __nv_bfloat16* a_tile, int row0,
                                         const __nv_bfloat16* b_tile) {
#pragma unroll
  for (int k0 = 0; k0 < kDepth; k0 += 16) {
    std::uint32_t a[4];
    load_matrix_x4(a, a_operand<kAStride>(a_tile, row0, k0));
    mma_step<kN>(acc, a, [&](std::uint32_t(&b)[4], int n0) { load_matrix_x4(b, b_rows<kBStride>(b_tile, n0, k0)); });
  }
}

// acc[n-block] += A · B, A given as register fragments over kDepth = 16·kSteps columns (from
// accumulators_to_a), B from a tile that stores it as is (row k = row k of B): P·V and friends.
template <int kSteps, int kN, int kBStride>
__device__ inline void mma_a_registers_b_columns(float (&acc)[kN / 8][4], const std::uint32_t (&a)[kSteps][4],
                                                 const __nv_bfloat16* b_tile) {
#pragma unroll
  for (int step = 0; step < kSteps; ++step)
    mma_step<kN>(acc, a[step], [&](std::uint32_t(&b)[4], int n0) {
      load_matrix_x4_transposed(b, b_columns<kBStride>(b_tile, step * 16, n0));
    });
}

// acc[n-block] += A · B over kDepth, A from a tile that stores it transposed (a_columns, rows
// m0..+16 of the product), B from a tile that stores it as is (b_columns), kN columns of
// output: dq̃ = dS · k̃ from a key-major dS tile.
template <int kDepth, int kN, int kAStride, int kBStride>
__device__ inline void mma_a_columns_b_columns(float (&acc)[kN / 8][4], const __nv_bfloat16* a_tile, int m0,
                                               const __nv_bfloat16* b_tile) {
#pragma unroll
  for (int k0 = 0; k0 < kDepth; k0 += 16) {
    std::uint32_t a[4];
    load_matrix_x4_transposed(a, a_columns<kAStride>(a_tile, m0, k0));
    mma_step<kN>(acc, a, [&](std::uint32_t(&b)[4], int n0) {
      load_matrix_x4_transposed(b, b_columns<kBStride>(b_tile, k0, n0));
    });
  }
}

// Re-packs a 16 × (16·kSteps) accumulator tile as kSteps A fragments.
template <int kSteps>
__device__ inline void accumulators_to_operand(std::uint32_t (&a)[kSteps][4], const float (&acc)[2 * kSteps][4]) {
#pragma unroll
  for (int step = 0; step < kSteps; ++step) accumulators_to_a(a[step], acc[2 * step], acc[2 * step + 1]);
}

template <int kBlocks>
__device__ inline void clear(float (&acc)[kBlocks][4]) {
#pragma unroll
  for (int i = 0; i < kBlocks; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
}

}  // namespace pope::kernels::mma_tiles
