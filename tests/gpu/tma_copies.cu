// One CTA's TMA copies on known inputs, for test_tma.cpp: the tensor maps, the mbarrier
// counting and the swizzle of the TMA-loading attention kernel checked on their own.
#include "tma_copies.hpp"

#include "attention/tma.cuh"

namespace pope::testing {

namespace {

using bf16 = __nv_bfloat16;
namespace tma = kernels::tma;

constexpr int kMaxPanels = 2;

__global__ void tma_copies_kernel(const __grid_constant__ CUtensorMap matrix_map,
                                  const __grid_constant__ CUtensorMap vector_map, int panels, int row0, int group,
                                  int first0, int first1, bf16* tile_out, float* runs_out, int* supported) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ __align__(1024) bf16 tile[kMaxPanels * 64 * 64];
  constexpr int kRun = 64, kStage = tma::vector_slots(kRun);
  __shared__ __align__(128) float runs[2 * kStage];  // TMA writes shared memory at 128-byte alignment
  __shared__ std::uint64_t arrived;
  const int t = int(threadIdx.x);
  if (t == 0) {
    tma::init_barrier(&arrived, 1);
    tma::fence_barrier_init();
  }
  __syncthreads();
  if (t == 0) {
    tma::arrive_expecting(&arrived, panels * 64 * 64 * sizeof(bf16) + 2 * tma::vector_box_bytes(kRun));
    for (int panel = 0; panel < panels; ++panel)
      tma::load_tile(tile + panel * 64 * 64, &matrix_map, 64 * panel, row0, group, &arrived);
    tma::load_vector(runs, &vector_map, first0, &arrived);
    tma::load_vector(runs + kStage, &vector_map, first1, &arrived);
  }
  tma::wait(&arrived, 0);
  for (int i = t; i < panels * 64 * 64; i += int(blockDim.x)) tile_out[i] = tile[i];
  for (int i = t; i < 2 * kRun; i += int(blockDim.x)) {
    const int run = i / kRun, first = run == 0 ? first0 : first1;
    runs_out[i] = runs[run * kStage + tma::vector_lead(first) + i % kRun];
  }
  if (t == 0) *supported = 1;
#else
  if (threadIdx.x == 0) *supported = 0;
#endif
}

}  // namespace

cudaError_t tma_copies(const __nv_bfloat16* matrix, std::int64_t columns, std::int64_t rows, std::int64_t groups,
                       std::int64_t row_stride, std::int64_t group_stride, int panels, int row0, int group,
                       const float* vector, std::int64_t count, const int (&first)[2], __nv_bfloat16* tile,
                       float* runs, int* supported) {
  if (panels < 1 || panels > kMaxPanels) return cudaErrorInvalidValue;
  CUtensorMap matrix_map{}, vector_map{};
  cudaError_t status = tma::encode_bf16_tiles(&matrix_map, matrix, columns, rows, groups, row_stride, group_stride, 64);
  if (status != cudaSuccess) return status;
  int shift = 0;
  status = tma::encode_f32_vector(&vector_map, vector, count, 64, &shift);
  if (status != cudaSuccess) return status;
  tma_copies_kernel<<<1, 128>>>(matrix_map, vector_map, panels, row0, group, first[0] + shift, first[1] + shift, tile,
                                runs, supported);
  return cudaGetLastError();
}

}  // namespace pope::testing
