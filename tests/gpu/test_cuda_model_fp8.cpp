// The model's FP8 path (Model::set_fp8, train.precision = "fp8") on the GPU: for RoPE and PoPE, the
// loss and the gradients of a few steps stay close to the same model's bf16 step. Reports SKIPPED
// (visibly) without a GPU with FP8 tensor cores (sm_89 or later).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/cuda_device.hpp"
#include "pope/backend.hpp"
#include "pope/model.hpp"
#include "pope/rng.hpp"
#include "unit/model_shape.hpp"
#include "unit/random_tokens.hpp"
#include "unit/vector_compare.hpp"

namespace {

using namespace pope;

class CudaModelFp8 : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModelFp8, LossAndGradientsStayCloseToTheBf16Steps) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto bf16_backend = make_backend(DeviceChoice::cuda), fp8_backend = make_backend(DeviceChoice::cuda);
  if (!fp8_backend->has_fp8_tensor_cores()) GTEST_SKIP() << fp8_backend->description() << " has no FP8 tensor cores";
  const ModelConfig c = pope::testing::model_config(pope::testing::kGpuTestShape, GetParam());
  Model bf16(c, *bf16_backend), fp8(c, *fp8_backend);
  bf16.initialize(7);
  fp8.initialize(7);
  fp8.set_fp8(16);
  Rng rng(8);
  const int B = 4, T = c.context_length;
  for (int step = 0; step < 3; ++step) {
    const auto tokens = pope::testing::random_tokens(rng, B * T, c.vocab_size),
               targets = pope::testing::random_tokens(rng, B * T, c.vocab_size);
    bf16.zero_gradients();
    fp8.zero_gradients();
    const double scale = 1.0 / (B * T);
    const LossSum want = bf16.forward_backward(tokens.data(), targets.data(), B, T, scale);
    const LossSum got = fp8.forward_backward(tokens.data(), targets.data(), B, T, scale);
    EXPECT_NEAR(got.mean(), want.mean(), 0.01 * want.mean()) << "step " << step;
    std::vector<float> want_grads(std::size_t(bf16.gradients().numel())), got_grads(want_grads.size());
    bf16_backend->copy_to_host(want_grads.data(), bf16.gradients());
    fp8_backend->copy_to_host(got_grads.data(), fp8.gradients());
    EXPECT_GT(pope::testing::cosine(got_grads, want_grads), 0.99) << "step " << step;
    EXPECT_NEAR(pope::testing::norm_ratio(got_grads, want_grads), 1.0, 0.05) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Encodings, CudaModelFp8, ::testing::Values("rope", "pope"));

}  // namespace
