// Hopper warpgroup matrix multiply (wgmma, sm_90a only): tiles in shared memory with the
// 128-byte swizzle, their matrix descriptors, and the m64n64k16 bf16 × bf16 → f32 products.
//
// Swizzled tiles: 64 bf16 (128 bytes) per row; element (r, c) of a tile of R rows × 64 columns
// sits at element r·64 + (((c / 8) XOR (r mod 8)) · 8 + c mod 8) — 16-byte chunks permuted by the
// row's place in its group of 8 rows. Wider tiles are panels of 64 columns, panel p starting at
// element p·R·64. Tiles start 1024-byte aligned (a whole 8-row swizzle pattern).
//
// Operands: a K-major operand (A: M rows × K, B: N rows × K, K contiguous) is a swizzled tile
// with K along the columns; one k16 step starts 32 bytes further along its rows. An M-major A
// or N-major B (K rows × M or N ≤ 64, M/N contiguous; e.g. v with K = keys, N = head dim) is a
// swizzled tile with K along the rows; one k16 step starts 16 rows (2048 bytes) further. In
// both, 8-row groups are 1024 bytes apart; see k_major and mn_major for the descriptors' offsets.
//
// Accumulators of m64nN: warp w of the warpgroup holds rows 16w..16w+15 in the mma.sync m16n8
// layout per 8-column block (mma_tiles.cuh), block j in registers 4j..4j+3. An A operand in
// registers has the m16n8k16 A layout for the warp's 16 rows, so accumulators re-packed with
// mma_tiles::accumulators_to_a feed the next product directly.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace pope::kernels::wgmma {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define POPE_WGMMA 1
#endif

constexpr int kWarpgroupThreads = 128;
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleGroupBytes = 8 * kSwizzleRowBytes;

// Element index of (r, c) in a swizzled tile of `rows` rows.
__host__ __device__ constexpr int swizzled_index(int rows, int r, int c) {
  return (c / 64) * rows * 64 + r * 64 + ((((c % 64) / 8) ^ (r % 8)) * 8) + c % 8;
}

// Matrix descriptor: start address, leading and stride byte offsets (16-byte units), 128-byte
// swizzle (mode 1 in bits 62–63).
__device__ inline std::uint64_t descriptor(const void* start, std::uint32_t leading_bytes, std::uint32_t stride_bytes) {
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(start));
  return std::uint64_t((address & 0x3FFFF) >> 4) | (std::uint64_t((leading_bytes >> 4) & 0x3FFF) << 16) |
         (std::uint64_t((stride_bytes >> 4) & 0x3FFF) << 32) | (std::uint64_t(1) << 62);
}

// K-major operand of `rows` rows: the k16 step starting at column k0, as a step (in the
// descriptor's 16-byte address units) from the descriptor of column 0, so that a product computes
// one descriptor per operand and adds compile-time constants for its other steps. The start
// address field holds address / 16 of a tile below 256 KiB of shared memory, far from
// overflowing into the next field.
__device__ inline std::uint64_t k_major(const __nv_bfloat16* tile) {
  return descriptor(tile, 1 << 4, kSwizzleGroupBytes);
}
__host__ __device__ constexpr std::uint64_t k_major_step(int rows, int k0) {
  return std::uint64_t(((k0 / 64) * rows * 64 + k0 % 64) * sizeof(__nv_bfloat16) / 16);
}

// M- or N-major operand (K along the tile's rows, exactly 64 of M or N along its columns: one
// swizzle pattern wide): the k16 step starting at row k0 is mn_major_step(k0) after row 0. Of the
// two byte offsets, one is the step between 8-row groups along K and the other the step between
// 64-column patterns along M/N, which one operand this wide never takes; both are set to the
// 8-row step, so the descriptor is right whichever field the hardware reads for K.
__device__ inline std::uint64_t mn_major(const __nv_bfloat16* tile) {
  return descriptor(tile, kSwizzleGroupBytes, kSwizzleGroupBytes);
}
__host__ __device__ constexpr std::uint64_t mn_major_step(int k0) {
  return std::uint64_t(k0 * 64 * sizeof(__nv_bfloat16) / 16);
}

// Stops a wgmma kernel launched from code built without sm_90a, whose products are compiled out
// (a loud error instead of wrong results; the dispatch never does it).
__device__ inline void require_wgmma_code() {
#ifndef POPE_WGMMA
  __trap();
#endif
}

#ifdef POPE_WGMMA
// Shared-memory writes of this thread (st.shared, cp.async) made visible to wgmma's reads.
__device__ inline void fence_shared_for_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

namespace detail {
__device__ inline void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ inline void wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across the wait, and A register
// fragments, which the tensor cores read until then, alive and unchanged up to it.
template <int kBlocks>
__device__ inline void fence_operands(float (&d)[kBlocks][4]) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
template <int kSteps>
__device__ inline void fence_operands(std::uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int j = 0; j < kSteps; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[j][e])::"memory");
}

#define POPE_WGMMA_D32                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define POPE_WGMMA_D32_OPERANDS(d)                                                                                 \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),       \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),   \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),   \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),   \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])

// d (+)= A · B over 16 of K, both in shared memory; kTransA / kTransB: M- / N-major (else K-major).
template <int kTransA, int kTransB>
__device__ inline void m64n64k16(float (&d)[8][4], std::uint64_t a, std::uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " POPE_WGMMA_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
      : POPE_WGMMA_D32_OPERANDS(d)
      : "l"(a), "l"(b), "r"(int(accumulate)), "n"(kTransA), "n"(kTransB));
}

// d += A · B, A from registers (this warp's 16 rows, m16n8k16 A layout), B N-major in shared memory.
__device__ inline void m64n64k16_registers(float (&d)[8][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " POPE_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : POPE_WGMMA_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
#undef POPE_WGMMA_D32
#undef POPE_WGMMA_D32_OPERANDS
}  // namespace detail

// The warpgroup's products. A batch is begin(), one or more issue_* calls, then
// complete(operands…) with every accumulator issued into and every A register fragment
// issued from: the tensor cores run the batch's products back to back and the warpgroup waits
// once. Until complete() those operands must not be read or written (A fragments computed
// before begin()).
__device__ inline void begin() { detail::fence(); }

template <class... Accumulators>
__device__ inline void complete(Accumulators&... accumulators) {
  detail::commit();
  detail::wait_all();
  (detail::fence_operands(accumulators), ...);
}

// acc = A · Bᵀ over kDepth (acc += A · Bᵀ with `onto`): A (this warpgroup's 64 rows) and B (64
// rows) K-major tiles of a_rows and b_rows rows.
template <int kDepth>
__device__ inline void issue_k_major(float (&acc)[8][4], const __nv_bfloat16* a_tile, int a_rows,
                                     const __nv_bfloat16* b_tile, int b_rows, bool onto = false) {
  const std::uint64_t a = k_major(a_tile), b = k_major(b_tile);
#pragma unroll
  for (int k0 = 0; k0 < kDepth; k0 += 16)
    detail::m64n64k16<0, 0>(acc, a + k_major_step(a_rows, k0), b + k_major_step(b_rows, k0), onto || k0 > 0);
}

// acc = A · B over kDepth rows of K: A M-major (tile rows: K, columns: this warpgroup's 64 rows),
// B N-major (tile rows: K, columns: 64 of N).
template <int kDepth>
__device__ inline void issue_mn_major(float (&acc)[8][4], const __nv_bfloat16* a_tile, const __nv_bfloat16* b_tile) {
  const std::uint64_t a = mn_major(a_tile), b = mn_major(b_tile);
#pragma unroll
  for (int k0 = 0; k0 < kDepth; k0 += 16)
    detail::m64n64k16<1, 1>(acc, a + mn_major_step(k0), b + mn_major_step(k0), k0 > 0);
}

// acc += A · B: A in registers (kSteps k16 fragments of this warp's 16 rows), B N-major (tile
// rows: K, columns: 64 of N).
template <int kSteps>
__device__ inline void issue_registers(float (&acc)[8][4], const std::uint32_t (&a)[kSteps][4],
                                       const __nv_bfloat16* b_tile) {
  const std::uint64_t b = mn_major(b_tile);
#pragma unroll
  for (int step = 0; step < kSteps; ++step) detail::m64n64k16_registers(acc, a[step], b + mn_major_step(16 * step));
}

// Single products, complete when they return.
template <int kDepth>
__device__ inline void product_k_major(float (&acc)[8][4], const __nv_bfloat16* a_tile, int a_rows,
                                       const __nv_bfloat16* b_tile, int b_rows, bool onto = false) {
  begin();
  issue_k_major<kDepth>(acc, a_tile, a_rows, b_tile, b_rows, onto);
  complete(acc);
}
template <int kDepth>
__device__ inline void product_mn_major(float (&acc)[8][4], const __nv_bfloat16* a_tile, const __nv_bfloat16* b_tile) {
  begin();
  issue_mn_major<kDepth>(acc, a_tile, b_tile);
  complete(acc);
}
template <int kSteps>
__device__ inline void accumulate_registers(float (&acc)[8][4], std::uint32_t (&a)[kSteps][4],
                                            const __nv_bfloat16* b_tile) {
  begin();
  issue_registers<kSteps>(acc, a, b_tile);
  complete(acc, a);
}
#endif  // POPE_WGMMA

}  // namespace pope::kernels::wgmma
