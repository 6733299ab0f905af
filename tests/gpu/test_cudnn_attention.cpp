// attention.impl = cudnn (src/cuda/cudnn_attention.cpp, cuDNN's fused SDPA on our encoded q̃, k̃)
// against our fused kernels on the same inputs: forward out and lse, backward dq, dk, dv (after
// the encodings' own backward, so through dq̃, dk̃) and the position-parameter gradients (PoPE's
// δ), for NoPE, RoPE, PoPE (q/k width 128 at head dim 64, with and without δ) and PJ-rotary, at
// T = 1 up to 1000 including odd lengths, and at head dim 128; repeated calls of one shape
// allocate nothing; encodings with a score bias are refused with a message that names
// attention.impl. Both sides round q̃, k̃ to bf16 the same way, so the differences are the two
// attention implementations' own bf16 roundings (P and dS as bf16 operands; cuDNN's dk̃ leaves it
// as bf16, ours as f32).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "attention_test_support.hpp"
#include "cuda/cuda_device.hpp"
#include "pope/config.hpp"
#include "pope/position.hpp"

namespace {

using namespace pope;
using namespace pope::attention_test;

// out and the gradients: bf16 values from two bf16-operand pipelines (each ≲ 1e-2 from exact).
constexpr double kBf16Tolerance = 2e-2;
// lse: f32 softmax statistics of the same bf16 q̃, k̃ products, summed in different orders.
constexpr double kLseTolerance = 1e-4;
// δ's gradient: an f32 sum over B·T rows of dk̃ terms that cancel in part (cuDNN's dk̃ is bf16).
constexpr double kParameterGradTolerance = 5e-2;

std::vector<EncodingCase> cudnn_cases() {
  return {
      {"nope", [] { return std::unique_ptr<PositionEncoding>(std::make_unique<NopeEncoding>()); }},
      {"rope", maker<RopeEncoding>(rope_with(1.0, RopeScalingKind::none, 1.0))},
      {"rope_yarn", maker<RopeEncoding>(rope_with(1.0, RopeScalingKind::yarn, 4.0)), false, 128},
      {"pope", maker<PopeEncoding>(pope_with(MagnitudeKind::softplus, true)), true},
      {"pope_no_delta", maker<PopeEncoding>(pope_with(MagnitudeKind::softplus, false))},
      {"pj_rotary", maker<PjRotaryEncoding>(PjConfig{})},
  };
}

void expect_cudnn_matches_fused(const Problem& p) {
  cuda::AttentionRunner fused_runner, cudnn_runner;
  const Result fused = run_on_gpu(fused_runner, p, /*keep_encoded=*/true, AttentionImpl::fused);
  const Result cudnn = run_on_gpu(cudnn_runner, p, /*keep_encoded=*/true, AttentionImpl::cudnn);
  EXPECT_EQ(count_non_finite(cudnn.out), 0u) << "out has unwritten or non-finite elements";
  EXPECT_EQ(count_non_finite(cudnn.lse), 0u) << "lse has unwritten or non-finite elements";
  EXPECT_EQ(count_non_finite(cudnn.dqkv), 0u) << "dqkv has unwritten or non-finite elements";
  EXPECT_LT(relative_error(cudnn.out, fused.out), kBf16Tolerance) << "out";
  EXPECT_LT(relative_error(cudnn.lse, fused.lse), kLseTolerance) << "lse (natural log of the softmax sums)";
  const std::size_t C = std::size_t(p.channels());
  const char* blocks[] = {"dq", "dk", "dv"};
  for (std::size_t block = 0; block < 3; ++block)
    EXPECT_LT(relative_error(cudnn.dqkv, fused.dqkv, 3 * C, block * C, (block + 1) * C), kBf16Tolerance)
        << blocks[block] << " block of dqkv";
  ASSERT_EQ(cudnn.grads.size(), fused.grads.size());
  for (std::size_t i = 0; i < cudnn.grads.size(); ++i)
    EXPECT_LT(relative_error(cudnn.grads[i], fused.grads[i]), kParameterGradTolerance) << "position grad " << i;
}

// A fixture (plain or parameterised) whose tests skip, visibly, without a GPU or without cuDNN.
template <class Fixture>
class NeedsCudnn : public Fixture {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
#ifndef POPE_HAVE_CUDNN
    GTEST_SKIP() << "built without cuDNN";
#endif
  }
};

class CudnnAttention : public NeedsCudnn<::testing::Test> {};
class CudnnAttentionVsFused : public NeedsCudnn<::testing::TestWithParam<std::tuple<EncodingCase, int>>> {};

TEST_P(CudnnAttentionVsFused, MatchesFusedKernels) {
  const auto& [encoding_case, seq_len] = GetParam();
  expect_cudnn_matches_fused(make_problem(encoding_case, /*batch=*/2, seq_len, /*n_head=*/3, /*head_dim=*/64,
                                          4321u + unsigned(seq_len)));
}

INSTANTIATE_TEST_SUITE_P(Encodings, CudnnAttentionVsFused,
                         ::testing::Combine(::testing::ValuesIn(cudnn_cases()), ::testing::Values(1, 37, 64, 200, 1000)),
                         [](const ::testing::TestParamInfo<std::tuple<EncodingCase, int>>& info) {
                           return std::get<0>(info.param).name + "_T" + std::to_string(std::get<1>(info.param));
                         });

// Head dim 128: q/k rows of 128 with v rows of 128 (NoPE, RoPE), and one head (B·H = 2 via B).
TEST_F(CudnnAttention, HeadDim128MatchesFusedKernels) {
  const std::vector<EncodingCase> cases = cudnn_cases();
  for (const auto& [case_index, batch, n_head, seq_len] :
       std::vector<std::tuple<std::size_t, int, int, int>>{{0, 2, 3, 100}, {1, 2, 3, 129}, {1, 2, 1, 1}}) {
    SCOPED_TRACE(cases[case_index].name + " T " + std::to_string(seq_len));
    expect_cudnn_matches_fused(make_problem(cases[case_index], batch, seq_len, n_head, 128, 77u));
  }
}

// The plans and their workspace are built on the first call of a shape; later calls of that
// shape reuse them (the scratch stays as it was) and the forward repeats bitwise.
TEST_F(CudnnAttention, RepeatedCallsReuseThePlansAndScratch) {
  const Problem p = make_problem(cudnn_cases()[3], 2, 200, 3, 64, 5u);
  cuda::AttentionRunner runner;
  const Result first = run_on_gpu(runner, p, /*keep_encoded=*/false, AttentionImpl::cudnn);
  const std::size_t bytes = runner.scratch_bytes();
  const Result second = run_on_gpu(runner, p, /*keep_encoded=*/false, AttentionImpl::cudnn);
  EXPECT_EQ(runner.scratch_bytes(), bytes);
  EXPECT_EQ(first.out, second.out);
  EXPECT_EQ(first.lse, second.lse);
}

// ALiBi and the PJ-bias methods add a score bias, which cuDNN's SDPA does not take.
TEST_F(CudnnAttention, ScoreBiasEncodingsAreRefused) {
  for (const std::string kind : {"alibi", "full"}) {
    SCOPED_TRACE(kind);
    const Problem p = make_problem(case_of_kind(kind, 3, 64), 1, 16, 3, 64, 9u);
    cuda::AttentionRunner runner;
    try {
      run_on_gpu(runner, p, false, AttentionImpl::cudnn);
      ADD_FAILURE() << "expected the cudnn impl to refuse " << kind;
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("attention.impl"), std::string::npos) << message;
      EXPECT_NE(message.find("score bias"), std::string::npos) << message;
      EXPECT_NE(message.find(p.encoding->kind()), std::string::npos) << message;
    }
  }
}

}  // namespace
