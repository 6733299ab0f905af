// Hopper's tensor memory accelerator (TMA, sm_90): one thread copies a whole tile from global to
// shared memory, the copy counts its bytes into an mbarrier in shared memory, and the threads
// that use the tile wait on that barrier's phase. Copies of bf16 tiles 64 columns (128 bytes)
// wide write the 128-byte swizzle of wgmma.cuh themselves; elements outside the tensor (rows
// past T, negative coordinates) arrive as zeros.
//
// Tensor maps describe the global tensor; they are built on the host for each call (pointers
// change) and passed to kernels as __grid_constant__ parameters.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace pope::kernels::tma {

// A 3-D bf16 tensor of `groups` × `rows` × `columns` (strides in elements, columns contiguous)
// read in boxes of box_rows × 64 columns × 1 group, swizzled for wgmma. Needs 16-byte aligned
// `base` and strides that are multiples of 8 elements; else cudaErrorInvalidValue.
cudaError_t encode_bf16_tiles(CUtensorMap* map, const void* base, std::int64_t columns, std::int64_t rows,
                              std::int64_t groups, std::int64_t row_stride, std::int64_t group_stride, int box_rows);

// A 3-D f32 tensor like encode_bf16_tiles' (columns contiguous), written from shared memory by
// reduce_add_tile in boxes of box_rows × 32 columns (128 bytes) × 1 group, in the 128-byte swizzle
// of f32_swizzled_index. Needs 16-byte aligned `base` and strides that are multiples of 4 elements.
cudaError_t encode_f32_tiles(CUtensorMap* map, const float* base, std::int64_t columns, std::int64_t rows,
                             std::int64_t groups, std::int64_t row_stride, std::int64_t group_stride, int box_rows);

// Columns of one encode_f32_tiles box (one 128-byte swizzle row).
constexpr int kF32BoxColumns = 32;
// Element index of (r, c) in a shared f32 tile of `rows` rows written by reduce_add_tile: panels
// of 32 columns, panel p starting at element p·rows·32; in each, 16-byte chunks of a row permuted
// by the row's place in its group of 8 rows (TMA's 128-byte swizzle, as wgmma.cuh's bf16 tiles).
__host__ __device__ constexpr int f32_swizzled_index(int rows, int r, int c) {
  return (c / kF32BoxColumns) * rows * kF32BoxColumns + r * kF32BoxColumns +
         ((((c % kF32BoxColumns) / 4) ^ (r % 8)) * 4) + c % 4;
}

// TMA copies a box of a vector only from a 16-byte aligned element: from any other start the
// kernel stopped with an illegal instruction (seen on an H200), though the map and the shared
// destination were aligned. So load_vector starts a run at its first element rounded down to
// 4 floats: the run's element i lands in slot vector_lead(first) + i, and a box is kVectorLead
// floats longer than the run it serves.
constexpr int kVectorLead = 4;
__host__ __device__ constexpr int vector_lead(int first) { return first & (kVectorLead - 1); }
// Shared floats to give one box of a `run`-float run: whole 128-byte TMA destinations, so that
// stages side by side stay aligned.
__host__ __device__ constexpr int vector_slots(int run) { return (run + kVectorLead + 31) / 32 * 32; }
// Bytes one run's box delivers (mbarrier transaction count).
__host__ __device__ constexpr std::uint32_t vector_box_bytes(int run) {
  return std::uint32_t(run + kVectorLead) * sizeof(float);
}

// A 1-D f32 vector of `count` elements read in runs of `run` elements (a multiple of 4; boxes of
// run + kVectorLead, at most 256). The map starts at `base` rounded down to 16 bytes, TMA's
// alignment: *shift (0…3) is the number of elements it moved back, to be added to every
// coordinate; a run reaching before element 0 then reads up to *shift elements before `base` (of
// the same 16 bytes) instead of zeros.
cudaError_t encode_f32_vector(CUtensorMap* map, const float* base, std::int64_t count, int run, int* shift);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace detail {
__device__ inline std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}
}  // namespace detail

// One thread: a barrier that completes a phase when `arrivals` threads have arrived and every
// byte they announced has landed. All threads sync (and fence_barrier_init) before using it.
__device__ inline void init_barrier(std::uint64_t* barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(detail::shared_address(barrier)), "r"(arrivals)
               : "memory");
}
// Makes initialised barriers visible to the TMA unit (the async proxy).
__device__ inline void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// This thread arrives on the barrier and announces `bytes` that copies will deliver to it.
__device__ inline void arrive_expecting(std::uint64_t* barrier, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(detail::shared_address(barrier)),
               "r"(bytes)
               : "memory");
}

// Waits until the barrier's phase with this parity (0, 1, 0, … for its 1st, 2nd, 3rd phase) is
// complete; the copies that phase counted are then visible to this thread.
__device__ inline void wait(std::uint64_t* barrier, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_loop:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_loop;\n}\n" ::"r"(detail::shared_address(barrier)),
      "r"(parity)
      : "memory");
}

// Box (column, row, group) of an encode_bf16_tiles map into `tile` (1024-byte aligned: the swizzle
// pattern is 8 rows of 128 bytes).
__device__ inline void load_tile(void* tile, const CUtensorMap* map, int column, int row, int group,
                                 std::uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          detail::shared_address(tile)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(column), "r"(row), "r"(group),
      "r"(detail::shared_address(barrier))
      : "memory");
}

// The run of an encode_f32_vector map from element `first` (shift included) into `slots`
// (128-byte aligned, as every TMA destination here), starting at slot vector_lead(first); zeros
// outside the vector.
__device__ inline void load_vector(float* slots, const CUtensorMap* map, int first, std::uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];\n" ::"r"(
          detail::shared_address(slots)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(first - vector_lead(first)), "r"(detail::shared_address(barrier))
      : "memory");
}

// Adds the box at (column, row, group) of an encode_f32_tiles map from `tile` (1024-byte aligned,
// laid out by f32_swizzled_index) to global memory element by element: the L2 does the adds,
// atomically per element, and skips elements outside the tensor. The shared writes to `tile` must
// be fenced for the async proxy (fence.proxy.async) and ordered before the call. The calling
// thread then commits its boxes as one bulk group (commit_bulk_group) and waits for their reads
// (wait_bulk_reads) before `tile` is written again, and for their writes (wait_bulk_writes) before
// it exits.
__device__ inline void reduce_add_tile(const CUtensorMap* map, const void* tile, int column, int row, int group) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
          reinterpret_cast<std::uint64_t>(map)),
      "r"(column), "r"(row), "r"(group), "r"(detail::shared_address(tile))
      : "memory");
}
__device__ inline void commit_bulk_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ inline void wait_bulk_reads() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ inline void wait_bulk_writes() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// The loop of the TMA-loading kernels, for blocks b in [first, end): thread 0 calls
// issue(b, stage, barrier) to announce and start block b's copies into shared stage
// (b − first) & 1, one block ahead; every thread waits for its block's copies on the stage's
// barrier, runs body(b, stage), and meets the others at the block's end, after which thread 0 may
// refill the stage. All threads of the block call this.
template <class Issue, class Body>
__device__ __forceinline__ void for_each_loaded(int first, int end, Issue&& issue, Body&& body) {
  __shared__ std::uint64_t arrived[2];
  if (threadIdx.x == 0) {
    init_barrier(&arrived[0], 1);
    init_barrier(&arrived[1], 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0 && first < end) issue(first, 0, &arrived[0]);
  for (int b = first; b < end; ++b) {
    const int step = b - first, stage = step & 1;
    if (threadIdx.x == 0 && b + 1 < end) issue(b + 1, stage ^ 1, &arrived[stage ^ 1]);
    wait(&arrived[stage], (step >> 1) & 1);  // a stage's barrier completes once per two blocks
    body(b, stage);
    __syncthreads();
  }
}
#endif

}  // namespace pope::kernels::tma
