// The TMA building blocks (kernels/attention/tma.cuh) on one CTA: a strided bf16 matrix's
// 64-row box of two 64-column panels, partly past the last row, lands in the swizzled layout of
// wgmma.cuh with zeros for the missing rows; 64-float runs of a vector starting at elements off
// TMA's 16-byte alignment, before its first and near its last element, arrive (after their lead
// slots) with zeros outside it, also from a base 4 bytes past that alignment. Reports SKIPPED (visibly) without a
// GPU, on a GPU that is not sm_90, or in a build without sm_90 code.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda/cuda_backend.hpp"
#include "cuda_op_test_support.hpp"
#include "hopper_test_support.hpp"
#include "tma_copies.hpp"

namespace {

using namespace pope;

TEST(Tma, TilesArriveSwizzledAndZeroFilledAndVectorsZeroOutside) {
  if (const std::string why = test::why_not_hopper("TMA"); !why.empty()) GTEST_SKIP() << why;
  auto backend = make_cuda_backend(0);
  // 2 groups × 100 rows × 128 columns, rows 136 elements apart, groups 100 rows + 8 apart.
  constexpr int kColumns = 128, kRows = 100, kGroups = 2, kRowStride = 136, kGroupStride = 108 * kRowStride;
  constexpr int kRow0 = 64, kGroup = 1, kCount = 300;
  const std::vector<float> matrix = test::random_bf16_values(kGroups * kGroupStride, 5);
  std::vector<float> vector(kCount);
  for (int i = 0; i < kCount; ++i) vector[i] = float(i + 1);
  const OwnedTensor matrix_t = test::make_tensor(*backend, {kGroups * kGroupStride}, DType::bf16, matrix),
                    vector_t = test::make_tensor(*backend, {kCount}, DType::f32, vector);
  const OwnedTensor tile_t = test::make_tensor(*backend, {2 * 64 * 64}, DType::bf16,
                                               std::vector<float>(2 * 64 * 64, std::nanf(""))),
                    runs_t = test::make_tensor(*backend, {128}, DType::f32, std::vector<float>(128, std::nanf("")));
  const OwnedTensor flag = allocate_tensor(*backend, {1}, DType::i32);
  backend->synchronize();
  // The vector from element `skip` on: skip = 1 is 4 bytes past TMA's 16-byte alignment.
  auto copy = [&](int skip, const int (&first)[2]) {
    return pope::testing::tma_copies(static_cast<const __nv_bfloat16*>(matrix_t.tensor.data), kColumns, kRows,
                                     kGroups, kRowStride, kGroupStride, 2, kRow0, kGroup,
                                     static_cast<const float*>(vector_t.tensor.data) + skip, kCount - skip, first,
                                     static_cast<__nv_bfloat16*>(tile_t.tensor.data),
                                     static_cast<float*>(runs_t.tensor.data), static_cast<int*>(flag.tensor.data));
  };
  const int first[2] = {-3, kCount - 10};
  ASSERT_EQ(copy(0, first), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int supported = -1;
  backend->copy_to_host(&supported, flag.tensor);
  if (supported == 0) GTEST_SKIP() << "this build has no sm_90 code";
  ASSERT_EQ(supported, 1);

  // The 128-byte swizzle (wgmma.cuh): 16-byte chunks of a 128-byte row permuted by row mod 8,
  // 64-column panels one after the other.
  auto swizzled = [](int r, int c) { return (c / 64) * 64 * 64 + r * 64 + (((c % 64) / 8) ^ (r % 8)) * 8 + c % 8; };
  const std::vector<double> tile = test::download(*backend, tile_t.tensor);
  int wrong = 0;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < kColumns; ++c) {
      const int row = kRow0 + r;
      const double want = row < kRows ? double(matrix[kGroup * kGroupStride + row * kRowStride + c]) : 0.0;
      const double got = tile[swizzled(r, c)];
      if (got != want && ++wrong <= 5) ADD_FAILURE() << "tile row " << r << " column " << c << ": " << got << ", want " << want;
    }
  EXPECT_EQ(wrong, 0) << "elements of the swizzled tile that differ";
  auto check_runs = [&](int skip, const int (&starts)[2]) {
    const std::vector<double> runs = test::download(*backend, runs_t.tensor);
    for (int run = 0; run < 2; ++run)
      for (int i = 0; i < 64; ++i) {
        const int at = starts[run] + i;
        EXPECT_EQ(runs[run * 64 + i], at >= 0 && at < kCount - skip ? double(vector[skip + at]) : 0.0)
            << "vector from element " << skip << ", run " << run << ", slot " << i;
      }
  };
  check_runs(0, first);
  const int shifted_first[2] = {0, kCount - 1 - 10};
  ASSERT_EQ(copy(1, shifted_first), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  check_runs(1, shifted_first);
}

}  // namespace
