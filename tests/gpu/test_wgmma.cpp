// The Hopper wgmma building blocks (kernels/attention/wgmma.cuh) on one warpgroup: a K-major ×
// K-major product over two swizzled panels, a registers × N-major product and an M-major ×
// N-major one, against f64 host
// products of the same bf16 values. Reports SKIPPED (visibly) without a GPU, on a GPU that is not
// sm_90, or in a build without sm_90a code.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda/cuda_backend.hpp"
#include "cuda_op_test_support.hpp"
#include "hopper_test_support.hpp"
#include "wgmma_products.hpp"

namespace {

using namespace pope;

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

TEST(Wgmma, SwizzledOperandsAndRegisterFragmentsGiveTheHostProducts) {
  if (const std::string why = test::why_not_hopper("wgmma"); !why.empty()) GTEST_SKIP() << why;
  auto backend = make_cuda_backend(0);
  const std::vector<float> a = test::random_bf16_values(64 * 128, 1), b = test::random_bf16_values(64 * 128, 2),
                           p = test::random_bf16_values(64 * 64, 3), v = test::random_bf16_values(64 * 64, 4);
  const OwnedTensor a_t = test::make_tensor(*backend, {64, 128}, DType::bf16, a),
                    b_t = test::make_tensor(*backend, {64, 128}, DType::bf16, b),
                    p_t = test::make_tensor(*backend, {64, 64}, DType::bf16, p),
                    v_t = test::make_tensor(*backend, {64, 64}, DType::bf16, v);
  const std::vector<float> poison(64 * 64, std::nanf(""));
  const OwnedTensor s_t = test::make_tensor(*backend, {64, 64}, DType::f32, poison),
                    o_t = test::make_tensor(*backend, {64, 64}, DType::f32, poison),
                    u_t = test::make_tensor(*backend, {64, 64}, DType::f32, poison);
  const OwnedTensor flag = allocate_tensor(*backend, {1}, DType::i32);
  backend->synchronize();
  ASSERT_EQ(pope::testing::wgmma_products(static_cast<const __nv_bfloat16*>(a_t.tensor.data),
                                          static_cast<const __nv_bfloat16*>(b_t.tensor.data),
                                          static_cast<const __nv_bfloat16*>(p_t.tensor.data),
                                          static_cast<const __nv_bfloat16*>(v_t.tensor.data),
                                          static_cast<float*>(s_t.tensor.data), static_cast<float*>(o_t.tensor.data),
                                          static_cast<float*>(u_t.tensor.data),
                                          static_cast<int*>(flag.tensor.data)),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int supported = -1;
  backend->copy_to_host(&supported, flag.tensor);
  if (supported == 0) GTEST_SKIP() << "this build has no sm_90a code (CMAKE_CUDA_ARCHITECTURES without 90a)";
  ASSERT_EQ(supported, 1);

  std::vector<double> s_want(64 * 64, 0.0), o_want(64 * 64, 0.0), u_want(64 * 64, 0.0);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) {
      for (int k = 0; k < 128; ++k) s_want[r * 64 + c] += double(a[r * 128 + k]) * double(b[c * 128 + k]);
      for (int k = 0; k < 64; ++k) {
        o_want[r * 64 + c] += double(p[r * 64 + k]) * double(v[k * 64 + c]);
        u_want[r * 64 + c] += double(p[k * 64 + r]) * double(v[k * 64 + c]);
      }
    }
  const std::vector<double> s_got = test::download(*backend, s_t.tensor), o_got = test::download(*backend, o_t.tensor);
  EXPECT_LT(relative_error(s_got, s_want), 1e-5) << "a · bᵀ from K-major swizzled panels";
  EXPECT_LT(relative_error(o_got, o_want), 1e-5) << "p (registers) · v (N-major)";
  EXPECT_LT(relative_error(test::download(*backend, u_t.tensor), u_want), 1e-5) << "pᵀ (M-major) · v (N-major)";
}

}  // namespace
