// CUDA causal attention (src/cuda/cuda_attention.cpp, kernels/attention/) against the CPU
// float reference for every encoding: forward out and lse, backward dqkv and the encoding's
// parameter gradients, on random bf16 inputs (the CPU gets the same values upcast). Outputs
// are poisoned with NaN before each run so that an unwritten element fails. PJ-rotary runs
// here at K = 0..3 (its transform alone is checked in test_cuda_pj_rotary.cpp). Sizes include
// T = 1 and T on both sides of the fused kernels' 64-row tiles (63, 64, 65) and not a multiple
// of any tile. Head dims 64 and 128 take the fused tensor-core kernels (flash_attention.cuh),
// other widths the simple kernels; the fused kernels are also checked on their own against a
// dense double reference with a random bias table (out, lse, dq̃, dk̃, dv and the bias
// gradient Ĝ), at T = 16384 against the simple kernels, and for bitwise determinism.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <typeinfo>
#include <vector>

#include "position/encodings.hpp"
#include "position/registry.hpp"
#include "cpu/cpu_backend.hpp"
#include "cuda/cuda_attention.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_device.hpp"
#include "attention/causal_attention.cuh"
#include "attention/flash_attention.cuh"
#include "attention/qk_transform.cuh"
#include "attention_test_support.hpp"

namespace {

using namespace pope;
using namespace pope::attention_test;

// Tolerances: bf16 outputs ≲ 1e-2 relative. lse is f32 arithmetic on the same inputs where
// q̃ = q (NoPE, ALiBi); transforms round q̃, k̃ to bf16 (as PyTorch does before SDPA), which moves
// each product by up to ~2·2⁻⁹ relative, and a score by more where its terms cancel: at T = 1
// (one score per row, nothing averages) xPos, whose q̃ and k̃ are scaled copies, reads 7.6e-3,
// RoPE at position 0 none (its rotation is exact there). δ's gradient is an f32 sum over B·T signed terms
// of dk̃, which the tensor cores form from bf16 operands (dS rounded to bf16 for dS·q̃), so
// its error is the bf16 one, lifted somewhat by cancellation in the sum.
constexpr double kBf16Tolerance = 1e-2;
constexpr double kLseTolerance = 1e-5;
constexpr double kRoundedLseTolerance = 1e-2;
constexpr double kParameterGradTolerance = 3e-2;


// The CPU float reference: its own forward, and the backward from the GPU's saved out and lse
// (what the GPU backward starts from too, so the comparison isolates the backward).
Result run_on_cpu(const Problem& p, const Result& gpu) {
  auto backend = make_cpu_backend("float", 0);
  std::vector<float> qkv = p.qkv, dout = p.dout;
  std::vector<std::vector<float>> param_values = p.params;
  Result r;
  r.grads = p.initial_grads;
  r.out.resize(p.dout.size());
  r.lse.resize(std::size_t(p.statistics()));
  r.dqkv.resize(p.qkv.size());
  std::vector<Tensor> params, grads;
  for (std::size_t i = 0; i < param_values.size(); ++i) {
    params.push_back(host_tensor(param_values[i], {std::int64_t(param_values[i].size())}));
    grads.push_back(host_tensor(r.grads[i], {std::int64_t(r.grads[i].size())}));
  }
  const Shape qkv_shape{p.rows(), 3 * p.channels()}, out_shape{p.rows(), p.channels()};
  const Shape lse_shape{p.shape.batch, p.shape.n_head, p.shape.seq_len};

  AttentionForward forward;
  forward.shape = p.shape;
  forward.encoding = p.encoding.get();
  forward.position = p.ctx;
  forward.qkv = host_tensor(qkv, qkv_shape);
  forward.out = host_tensor(r.out, out_shape);
  forward.lse = host_tensor(r.lse, lse_shape);
  forward.position_params = params;
  backend->attention_forward(forward);

  std::vector<float> saved_out = gpu.out, saved_lse = gpu.lse;
  AttentionBackward backward;
  backward.shape = p.shape;
  backward.encoding = p.encoding.get();
  backward.position = p.ctx;
  backward.qkv = forward.qkv;
  backward.out = host_tensor(saved_out, out_shape);
  backward.lse = host_tensor(saved_lse, lse_shape);
  backward.dout = host_tensor(dout, out_shape);
  backward.dqkv = host_tensor(r.dqkv, qkv_shape);
  backward.position_params = params;
  backward.position_grads = grads;
  backend->attention_backward(backward);
  return r;
}

void expect_matches_cpu(const Problem& p, const Result& gpu, const Result& cpu) {
  EXPECT_EQ(count_non_finite(gpu.out), 0u) << "out has unwritten or non-finite elements";
  EXPECT_EQ(count_non_finite(gpu.lse), 0u) << "lse has unwritten or non-finite elements";
  EXPECT_EQ(count_non_finite(gpu.dqkv), 0u) << "dqkv has unwritten or non-finite elements";
  EXPECT_LT(relative_error(gpu.out, cpu.out), kBf16Tolerance) << "out";
  EXPECT_LT(relative_error(gpu.lse, cpu.lse), p.encoding->transforms_qk() ? kRoundedLseTolerance : kLseTolerance)
      << "lse";
  const std::size_t C = std::size_t(p.channels());
  const char* blocks[] = {"dq", "dk", "dv"};
  for (std::size_t block = 0; block < 3; ++block)
    EXPECT_LT(relative_error(gpu.dqkv, cpu.dqkv, 3 * C, block * C, (block + 1) * C), kBf16Tolerance)
        << blocks[block] << " block of dqkv";
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  const TransformPlan plan = p.encoding->transform_plan(p.ctx);
  for (std::size_t i = 0; i < gpu.grads.size(); ++i) {
    EXPECT_LT(relative_error(gpu.grads[i], cpu.grads[i]), kParameterGradTolerance) << "position grad " << i;
    // A clamped δ outside [−2π, 0] gets no gradient: its accumulator must keep its value exactly.
    // An unbounded one gets its gradient there too (but at T = 1, where a key's gradient cancels).
    if (int(i) != plan.delta_param) continue;
    for (std::size_t j = 0; j < p.params[i].size(); ++j) {
      const float delta = p.params[i][j];
      if (delta > 0.0f || delta < -6.2831853f) {
        if (plan.clamp_delta)
          EXPECT_EQ(gpu.grads[i][j], p.initial_grads[i][j]) << "δ index " << j;
        else if (p.shape.seq_len > 1)
          EXPECT_NE(gpu.grads[i][j], p.initial_grads[i][j]) << "δ index " << j;
      }
    }
  }
}


// Encodings with options other than the defaults, built directly; the tests below pick them by
// index.
std::vector<EncodingCase> variant_cases() {
  AlibiConfig half_heads;
  half_heads.head_fraction = 0.5;
  return {
      {"nope", [] { return std::unique_ptr<PositionEncoding>(std::make_unique<NopeEncoding>()); }},
      {"rope", maker<RopeEncoding>(rope_with(1.0, RopeScalingKind::none, 1.0))},
      {"rope_fraction_half", maker<RopeEncoding>(rope_with(0.5, RopeScalingKind::none, 1.0))},
      // L_train 128 < T so that YaRN's ramp and its logit multiplier both matter.
      {"rope_yarn", maker<RopeEncoding>(rope_with(1.0, RopeScalingKind::yarn, 4.0)), false, 128},
      {"pope_softplus", maker<PopeEncoding>(pope_with(MagnitudeKind::softplus, true)), true},
      {"pope_identity", maker<PopeEncoding>(pope_with(MagnitudeKind::identity, true)), true},
      {"pope_relu", maker<PopeEncoding>(pope_with(MagnitudeKind::relu, true)), true},
      {"pope_no_delta", maker<PopeEncoding>(pope_with(MagnitudeKind::softplus, false))},
      {"alibi", maker<AlibiEncoding>(AlibiConfig{})},
      {"alibi_half_heads", maker<AlibiEncoding>(half_heads)},
      // K = 1 (default); within L_train the shear c_p ≤ 1, so q̃, k̃ keep bf16's relative precision.
      {"pj_rotary", maker<PjRotaryEncoding>(PjConfig{})},
      {"pope_delta_unbounded", maker<PopeEncoding>(pope_with(MagnitudeKind::softplus, true, DeltaBound::none)), true},
  };
}

// Every registered method as the model builds it (position/registry.hpp), then the variants.
std::vector<EncodingCase> encoding_cases() {
  std::vector<EncodingCase> cases;
  for (const std::string& kind : position_kinds()) cases.push_back(case_of_kind(kind, 3, 64));
  for (EncodingCase variant : variant_cases()) {
    variant.name = "variant_" + variant.name;
    cases.push_back(std::move(variant));
  }
  return cases;
}

// Whether the case's encoding has a learned bias, whose gradient needs the fused kernels.
bool learns_its_bias(const EncodingCase& c, int n_head, int head_dim) {
  PositionContext ctx;
  ctx.seq_len = 8;
  ctx.n_head = n_head;
  ctx.head_dim = head_dim;
  const auto encoding = c.make();
  return encoding->has_score_bias() && encoding->bias_plan(ctx).learned();
}

PjConfig pj_rotary_of_order(int order) {
  PjConfig config;
  config.rotary_order = order;
  return config;
}

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

class CudaAttentionVsCpu : public ::testing::TestWithParam<std::tuple<EncodingCase, int>> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaAttentionVsCpu, MatchesCpuReference) {
  const auto& [encoding_case, seq_len] = GetParam();
  const Problem problem =
      make_problem(encoding_case, /*batch=*/2, seq_len, /*n_head=*/3, /*head_dim=*/64, 1234u + seq_len);
  cuda::AttentionRunner runner;
  const Result gpu = run_on_gpu(runner, problem);
  expect_matches_cpu(problem, gpu, run_on_cpu(problem, gpu));
}

INSTANTIATE_TEST_SUITE_P(Encodings, CudaAttentionVsCpu,
                         ::testing::Combine(::testing::ValuesIn(encoding_cases()), ::testing::Values(1, 37, 63, 64, 65, 200, 1000)),
                         [](const ::testing::TestParamInfo<std::tuple<EncodingCase, int>>& info) {
                           return std::get<0>(info.param).name + "_T" + std::to_string(std::get<1>(info.param));
                         });

// head_dim 128 takes the fused (128, 128) kernels for NoPE, RoPE and ALiBi; wider q/k rows
// (PoPE at d = 128 is 256 wide, at d = 256 512 wide) and d = 96 take the simple kernels.
TEST_F(CudaAttention, WideHeadsMatchCpu) {
  const std::vector<EncodingCase> cases = variant_cases();
  for (const auto& [case_index, head_dim, seq_len] : std::vector<std::tuple<std::size_t, int, int>>{
           {4, 128, 100}, {1, 128, 100}, {0, 128, 200}, {8, 128, 65}, {4, 256, 40}, {8, 96, 50}}) {
    SCOPED_TRACE(cases[case_index].name + " head_dim " + std::to_string(head_dim));
    const Problem problem = make_problem(cases[case_index], 2, seq_len, 3, head_dim, 99u);
    cuda::AttentionRunner runner;
    const Result gpu = run_on_gpu(runner, problem);
    expect_matches_cpu(problem, gpu, run_on_cpu(problem, gpu));
  }
}

// PJ-rotary of higher jet orders: K = 3 (blocks of 8) at d = 64 and 128 on the fused kernels,
// K = 2 (blocks of 6) at d = 96 on the simple kernels; K = 0 is RoPE with adjacent pairs.
TEST_F(CudaAttention, PjRotaryOrdersMatchCpu) {
  for (const auto& [order, head_dim, seq_len] :
       std::vector<std::tuple<int, int, int>>{{0, 64, 65}, {2, 96, 50}, {3, 64, 129}, {3, 128, 100}}) {
    SCOPED_TRACE("pj_rotary K = " + std::to_string(order) + " head_dim " + std::to_string(head_dim));
    const EncodingCase c{"pj_rotary", maker<PjRotaryEncoding>(pj_rotary_of_order(order))};
    const Problem problem = make_problem(c, 2, seq_len, 3, head_dim, 31u + unsigned(order));
    cuda::AttentionRunner runner;
    const Result gpu = run_on_gpu(runner, problem);
    expect_matches_cpu(problem, gpu, run_on_cpu(problem, gpu));
  }
}

// Evaluation windows start past position 0: phases p·ω reach thousands of radians.
TEST_F(CudaAttention, PositionOffsetMatchesCpu) {
  std::vector<EncodingCase> cases = {variant_cases()[1], variant_cases()[4], variant_cases()[10]};
  for (const std::string& kind : position_kinds()) cases.push_back(case_of_kind(kind, 3, 64));
  for (EncodingCase c : cases) {
    SCOPED_TRACE(c.name);
    c.position_offset = 9000;
    // PJ-rotary shears with the absolute position: L_train = 9000 keeps c_p ≈ 1 at the window,
    // as in a model evaluated at its training length (tests/gpu/test_cuda_pj_rotary.cpp covers
    // large shears on the transform alone).
    if (c.name == "pj_rotary") c.train_length = 9000;
    const Problem problem = make_problem(c, 2, 37, 3, 64, 7u);
    cuda::AttentionRunner runner;
    const Result gpu = run_on_gpu(runner, problem);
    expect_matches_cpu(problem, gpu, run_on_cpu(problem, gpu));
  }
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(CudaAttention, RepeatedRunsAreBitwiseEqual) {
  for (const EncodingCase& c : {variant_cases()[1], variant_cases()[4], variant_cases()[8]}) {
    SCOPED_TRACE(c.name);
    const Problem problem = make_problem(c, 2, 300, 3, 64, 5u);
    cuda::AttentionRunner runner;
    const Result first = run_on_gpu(runner, problem);
    const Result second = run_on_gpu(runner, problem);
    EXPECT_TRUE(bitwise_equal(first.out, second.out));
    EXPECT_TRUE(bitwise_equal(first.lse, second.lse));
    EXPECT_TRUE(bitwise_equal(first.dqkv, second.dqkv));
    ASSERT_EQ(first.grads.size(), second.grads.size());
    for (std::size_t i = 0; i < first.grads.size(); ++i) EXPECT_TRUE(bitwise_equal(first.grads[i], second.grads[i]));
  }
}

// The backward from the q̃, k̃ the forward kept is the backward that derives them again, bit for
// bit, for every encoding (the same transform of the same inputs), and for the learned biases
// with the table the forward kept (built on the side stream) against the one built again; T = 200
// takes the fused kernels, T = 37 with head_dim 48 the simple ones (not for a learned bias, whose
// gradient needs the fused kernels).
TEST_F(CudaAttention, KeptEncodingsGiveTheBackwardOfReencodingBitwise) {
  std::vector<EncodingCase> cases = variant_cases();
  for (const std::string& kind : position_kinds()) cases.push_back(case_of_kind(kind, 2, 64));
  for (std::size_t i = 0; i < cases.size(); ++i)
    for (const auto& [seq_len, head_dim] : {std::pair{200, 64}, std::pair{37, 48}}) {
      const EncodingCase& c = cases[i];
      if (head_dim != 64 && learns_its_bias(c, 2, head_dim)) continue;
      SCOPED_TRACE(c.name + " T=" + std::to_string(seq_len) + " d=" + std::to_string(head_dim));
      const Problem problem = make_problem(c, 2, seq_len, 2, head_dim, 11u);
      cuda::AttentionRunner runner;
      const Result derived = run_on_gpu(runner, problem);
      const Result kept = run_on_gpu(runner, problem, true);
      EXPECT_TRUE(bitwise_equal(derived.out, kept.out));
      EXPECT_TRUE(bitwise_equal(derived.dqkv, kept.dqkv));
      EXPECT_EQ(count_non_finite(kept.dqkv), 0u);
      ASSERT_EQ(derived.grads.size(), kept.grads.size());
      for (std::size_t g = 0; g < kept.grads.size(); ++g) EXPECT_TRUE(bitwise_equal(derived.grads[g], kept.grads[g]));
    }
}

// Long context: the runner's memory stays O(B·H·T·width) (its row buffers), never a T×T
// matrix. Counted from the runner's own scratch, not from the device's free memory, which
// other processes sharing the GPU change.
TEST_F(CudaAttention, LongContextMemoryStaysLinear) {
  const EncodingCase pope = variant_cases()[4];
  const int batch = 2, n_head = 4, seq_len = 4096, head_dim = 64;
  const Problem problem = make_problem(pope, batch, seq_len, n_head, head_dim, 11u);
  const std::size_t rows = std::size_t(batch) * n_head * seq_len;
  // Inputs and outputs of the call itself (qkv, dout, out, dqkv in bf16, lse) are allocated by run_on_gpu.
  const std::size_t io_bytes = problem.qkv.size() * 2 * 2 + problem.dout.size() * 2 * 2 + rows * 4;
  const std::size_t scratch_bound = 4 * rows * 2 * head_dim * sizeof(float) + rows * sizeof(float);
  const std::size_t slack = std::size_t(1) << 20;  // the encoding's tables
  cuda::AttentionRunner runner;
  run_on_gpu(runner, problem);  // first call grows the scratch
  const std::size_t grown = runner.scratch_bytes();
  EXPECT_LT(grown, scratch_bound + slack) << "scratch beyond O(B·H·T·width)";
  const std::size_t score_matrix = rows * std::size_t(seq_len) * sizeof(float);
  EXPECT_LT(grown, score_matrix / 4) << "memory grows like a T×T matrix";

  const Result result = run_on_gpu(runner, problem);
  EXPECT_EQ(count_non_finite(result.out), 0u);
  EXPECT_EQ(count_non_finite(result.dqkv), 0u);
  std::printf("pope attention B=%d H=%d T=%d d=%d: scratch %.1f MiB (io %.1f MiB)\n", batch, n_head, seq_len,
              head_dim, double(grown) / (1 << 20), double(io_bytes) / (1 << 20));
}

// ---------------------------------------------------------------- bad calls

// Claims a q/k transform but declares no plan for it: the GPU cannot know what to run.
class MysteryEncoding final : public PositionEncoding {
 public:
  std::string kind() const override { return "mystery"; }
  bool transforms_qk() const override { return true; }
};

// A valid small forward call whose pieces the tests below spoil one at a time.
struct SmallCall {
  DeviceBuffer qkv{std::size_t(2 * 8 * 3 * 64) * 2}, out{std::size_t(2 * 8 * 64) * 2}, lse{std::size_t(2 * 1 * 8) * 4};
  NopeEncoding nope;
  AttentionForward args;
  SmallCall() {
    args.shape = {2, 8, 1, 64};
    args.encoding = &nope;
    args.position.seq_len = 8;
    args.position.train_length = 1024;
    args.position.n_head = 1;
    args.position.head_dim = 64;
    args.qkv = qkv.tensor(DType::bf16, {16, 192});
    args.out = out.tensor(DType::bf16, {16, 64});
    args.lse = lse.tensor(DType::f32, {2, 1, 8});
  }
};

template <class Error>
std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no " + std::string(typeid(Error).name()) + " thrown)";
}

// ---------------------------------------------------------------- fused kernels on their own

// One call of the attention kernels on encoded rows: q̃, k̃ bf16 [B, H, T, W] given directly, v
// from qkv, a random bias table, as exact bf16 values held in float.
struct KernelProblem {
  kernels::AttentionDims dims;
  float scale = 0.0f;
  std::vector<float> q, k, qkv, dout, bias, bias_grad_initial;
  std::vector<float> bias_slopes;  // [n_head] when `bias` is linear and handed over as slopes too
  bool bias_table = true;          // false: no score bias handed over (`bias` must then be zeros)

  std::size_t channels() const { return std::size_t(dims.n_head) * dims.head_dim; }
  std::size_t rows() const { return std::size_t(dims.batch) * dims.seq_len; }
  std::size_t statistics() const { return rows() * dims.n_head; }
  std::size_t encoded() const { return statistics() * dims.qk_width; }
};

KernelProblem make_kernel_problem(int batch, int seq_len, int n_head, int width, int head_dim, unsigned seed) {
  std::mt19937 engine(seed);
  KernelProblem p;
  p.dims = {batch, seq_len, n_head, head_dim, width};
  p.scale = 1.0f / std::sqrt(float(width));
  p.q = random_bf16_values(p.encoded(), -1.5f, 1.5f, engine);
  p.k = random_bf16_values(p.encoded(), -1.5f, 1.5f, engine);
  p.qkv = random_bf16_values(p.rows() * 3 * p.channels(), -1.5f, 1.5f, engine);
  p.dout = random_bf16_values(p.rows() * p.channels(), -1.0f, 1.0f, engine);
  p.bias = random_bf16_values(std::size_t(n_head) * seq_len, -2.0f, 1.0f, engine);
  p.bias_grad_initial = random_bf16_values(p.bias.size(), -0.5f, 0.5f, engine);
  return p;
}

// out, lse, dq̃, dk̃, dv (v block of dqkv) and the bias gradient Ĝ (initial value included).
struct KernelResult {
  std::vector<float> out, lse, dq, dk, dv, bias_grad;
  std::vector<float> dqkv;  // all three blocks
};

// The dense double reference: scores, softmax, its backward and the diagonal sums of dS.
KernelResult dense_reference(const KernelProblem& p) {
  const int B = p.dims.batch, T = p.dims.seq_len, H = p.dims.n_head, d = p.dims.head_dim, W = p.dims.qk_width;
  const std::size_t C = p.channels();
  KernelResult r;
  r.out.assign(p.rows() * C, 0.0f);
  r.lse.assign(p.statistics(), 0.0f);
  r.dq.assign(p.encoded(), 0.0f);
  r.dk.assign(p.encoded(), 0.0f);
  r.dv.assign(p.rows() * C, 0.0f);
  r.bias_grad = p.bias_grad_initial;
  std::vector<double> diag(std::size_t(H) * T, 0.0);
  std::vector<double> prob(T), dk(std::size_t(T) * W), dv(std::size_t(T) * d);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const std::size_t bh = std::size_t(b) * H + h;
      auto q_row = [&](int t) { return &p.q[(bh * T + t) * W]; };
      auto k_row = [&](int s) { return &p.k[(bh * T + s) * W]; };
      auto v_row = [&](int s) { return &p.qkv[(std::size_t(b) * T + s) * 3 * C + 2 * C + std::size_t(h) * d]; };
      auto dout_row = [&](int t) { return &p.dout[(std::size_t(b) * T + t) * C + std::size_t(h) * d]; };
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int t = 0; t < T; ++t) {
        double max_score = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          double dot = 0.0;
          for (int c = 0; c < W; ++c) dot += double(q_row(t)[c]) * k_row(s)[c];
          prob[s] = dot * p.scale + p.bias[std::size_t(h) * T + (t - s)];
          max_score = std::max(max_score, prob[s]);
        }
        double sum = 0.0;
        for (int s = 0; s <= t; ++s) sum += std::exp(prob[s] - max_score);
        r.lse[bh * T + t] = float(max_score + std::log(sum));
        std::vector<double> out(d, 0.0);
        for (int s = 0; s <= t; ++s) {
          prob[s] = std::exp(prob[s] - max_score) / sum;
          for (int c = 0; c < d; ++c) out[c] += prob[s] * v_row(s)[c];
        }
        double row_dot = 0.0;
        for (int c = 0; c < d; ++c) {
          r.out[(std::size_t(b) * T + t) * C + std::size_t(h) * d + c] = float(out[c]);
          row_dot += out[c] * dout_row(t)[c];
        }
        std::vector<double> dq(W, 0.0);
        for (int s = 0; s <= t; ++s) {
          double dp = 0.0;
          for (int c = 0; c < d; ++c) dp += double(dout_row(t)[c]) * v_row(s)[c];
          const double ds = prob[s] * (dp - row_dot);
          diag[std::size_t(h) * T + (t - s)] += ds;
          for (int c = 0; c < W; ++c) {
            dq[c] += ds * k_row(s)[c] * p.scale;
            dk[std::size_t(s) * W + c] += ds * q_row(t)[c] * p.scale;
          }
          for (int c = 0; c < d; ++c) dv[std::size_t(s) * d + c] += prob[s] * dout_row(t)[c];
        }
        for (int c = 0; c < W; ++c) r.dq[(bh * T + t) * W + c] = float(dq[c]);
      }
      for (int s = 0; s < T; ++s) {
        for (int c = 0; c < W; ++c) r.dk[(bh * T + s) * W + c] = float(dk[std::size_t(s) * W + c]);
        for (int c = 0; c < d; ++c)
          r.dv[(std::size_t(b) * T + s) * C + std::size_t(h) * d + c] = float(dv[std::size_t(s) * d + c]);
      }
    }
  for (std::size_t i = 0; i < diag.size(); ++i) r.bias_grad[i] = float(double(r.bias_grad[i]) + diag[i]);
  return r;
}

// The fused kernels' forward and backward (with the bias gradient if p.bias_table) on the device;
// deterministic = false: dq̃ by atomic adds in the key kernel. With a q/k transform, its backward
// fills dqkv's q and k blocks: in the kernels' epilogues (fuse_transform) or by
// encode_qk_backward from dq̃, dk̃ afterwards. round_encoded: dq̃, dk̃ written in bf16
// (AttentionGradients::dq_bf16, dk_bf16) and returned as floats.
KernelResult run_flash_kernels(const KernelProblem& p, bool deterministic = true,
                               const kernels::QkTransformParams* transform = nullptr, bool fuse_transform = false,
                               bool round_encoded = false) {
  const std::size_t C = p.channels();
  DeviceBuffer q(p.q.size() * 2), k(p.k.size() * 2), qkv(p.qkv.size() * 2), dout(p.dout.size() * 2);
  DeviceBuffer bias(p.bias.size() * 4), bias_grad(p.bias.size() * 4), out(p.dout.size() * 2), dqkv(p.qkv.size() * 2);
  DeviceBuffer lse(p.statistics() * 4), row_dot(p.statistics() * 4), dq(p.encoded() * 4), dk(p.encoded() * 4);
  DeviceBuffer dq_bf16(p.encoded() * 2), dk_bf16(p.encoded() * 2);
  DeviceBuffer partials(kernels::flash_bias_grad_partial_floats(p.dims) * 4);
  DeviceBuffer slopes(std::max<std::size_t>(1, p.bias_slopes.size()) * 4);
  if (!p.bias_slopes.empty()) slopes.upload(p.bias_slopes.data());
  q.upload(to_bf16(p.q).data());
  k.upload(to_bf16(p.k).data());
  qkv.upload(to_bf16(p.qkv).data());
  dout.upload(to_bf16(p.dout).data());
  bias.upload(p.bias.data());
  bias_grad.upload(p.bias_grad_initial.data());
  for (DeviceBuffer* b : {&out, &dqkv, &lse, &row_dot, &dq, &dk, &dq_bf16, &dk_bf16, &partials}) b->poison();

  kernels::EncodedAttention in;
  in.q = static_cast<const __nv_bfloat16*>(q.tensor(DType::bf16, {}).data);
  in.k = static_cast<const __nv_bfloat16*>(k.tensor(DType::bf16, {}).data);
  in.qkv = static_cast<const __nv_bfloat16*>(qkv.tensor(DType::bf16, {}).data);
  in.score.scale = p.scale;
  if (p.bias_table) in.score.bias = static_cast<const float*>(bias.tensor(DType::f32, {}).data);
  if (!p.bias_slopes.empty()) in.score.bias_slopes = static_cast<const float*>(slopes.tensor(DType::f32, {}).data);
  EXPECT_TRUE(kernels::flash_attention_supports(p.dims, in));
  auto* out_data = static_cast<__nv_bfloat16*>(out.tensor(DType::bf16, {}).data);
  auto* lse_data = static_cast<float*>(lse.tensor(DType::f32, {}).data);
  POPE_CUDA_CHECK(kernels::flash_attention_forward(p.dims, in, out_data, lse_data, nullptr));
  kernels::AttentionGradients grads;
  grads.out = out_data;
  grads.lse = lse_data;
  grads.dout = static_cast<const __nv_bfloat16*>(dout.tensor(DType::bf16, {}).data);
  grads.row_dot = static_cast<float*>(row_dot.tensor(DType::f32, {}).data);
  grads.dq = static_cast<float*>(dq.tensor(DType::f32, {}).data);
  grads.dk = static_cast<float*>(dk.tensor(DType::f32, {}).data);
  grads.dqkv = static_cast<__nv_bfloat16*>(dqkv.tensor(DType::bf16, {}).data);
  if (p.bias_table) {
    grads.bias_grad = static_cast<float*>(bias_grad.tensor(DType::f32, {}).data);
    grads.bias_grad_partials = static_cast<float*>(partials.tensor(DType::f32, {}).data);
  }
  grads.deterministic = deterministic;
  if (transform != nullptr && fuse_transform) {
    EXPECT_TRUE(kernels::flash_attention_fuses_qk_backward(p.dims, in, *transform, deterministic));
    grads.qk_backward_fused = true;
    grads.qk_transform = *transform;
  }
  if (round_encoded) {
    grads.dq_bf16 = static_cast<__nv_bfloat16*>(dq_bf16.tensor(DType::bf16, {}).data);
    grads.dk_bf16 = static_cast<__nv_bfloat16*>(dk_bf16.tensor(DType::bf16, {}).data);
  }
  POPE_CUDA_CHECK(kernels::flash_attention_backward(p.dims, in, grads, nullptr));
  if (transform != nullptr && !fuse_transform)
    POPE_CUDA_CHECK(kernels::encode_qk_backward(p.dims, *transform, in.qkv, grads.dq, grads.dk, grads.dqkv, nullptr));
  POPE_CUDA_CHECK(cudaDeviceSynchronize());

  KernelResult r;
  std::vector<__nv_bfloat16> staging(p.dout.size());
  out.download(staging.data());
  r.out = from_bf16(staging);
  staging.resize(p.qkv.size());
  dqkv.download(staging.data());
  r.dqkv = from_bf16(staging);
  const std::vector<float>& dqkv_values = r.dqkv;
  r.dv.resize(p.rows() * C);
  for (std::size_t n = 0; n < p.rows(); ++n)
    std::copy_n(dqkv_values.begin() + std::ptrdiff_t(n * 3 * C + 2 * C), C, r.dv.begin() + std::ptrdiff_t(n * C));
  r.lse.resize(p.statistics());
  lse.download(r.lse.data());
  if (round_encoded) {
    staging.resize(p.encoded());
    dq_bf16.download(staging.data());
    r.dq = from_bf16(staging);
    dk_bf16.download(staging.data());
    r.dk = from_bf16(staging);
  } else {
    r.dq.resize(p.encoded());
    dq.download(r.dq.data());
    r.dk.resize(p.encoded());
    dk.download(r.dk.data());
  }
  r.bias_grad.resize(p.bias.size());
  bias_grad.download(r.bias_grad.data());
  return r;
}

class FlashKernels : public ::testing::TestWithParam<std::tuple<std::pair<int, int>, int, bool>> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// All outputs and Ĝ of the fused kernels against the dense double reference; Ĝ accumulates onto
// its initial values (the unwritten-element check also catches dq̃ rows the atomic mode would
// miss: the buffer is poisoned, and that mode zeroes it first).
void expect_flash_matches_reference(const KernelProblem& p, bool deterministic) {
  const KernelResult gpu = run_flash_kernels(p, deterministic);
  const KernelResult ref = dense_reference(p);
  for (const auto& [name, values] : std::vector<std::pair<std::string, const std::vector<float>*>>{
           {"out", &gpu.out}, {"lse", &gpu.lse}, {"dq", &gpu.dq}, {"dk", &gpu.dk}, {"dv", &gpu.dv},
           {"bias_grad", &gpu.bias_grad}})
    EXPECT_EQ(count_non_finite(*values), 0u) << name << " has unwritten or non-finite elements";
  EXPECT_LT(relative_error(gpu.out, ref.out), kBf16Tolerance) << "out";
  EXPECT_LT(relative_error(gpu.lse, ref.lse), kLseTolerance) << "lse";
  EXPECT_LT(relative_error(gpu.dq, ref.dq), kBf16Tolerance) << "dq";
  EXPECT_LT(relative_error(gpu.dk, ref.dk), kBf16Tolerance) << "dk";
  EXPECT_LT(relative_error(gpu.dv, ref.dv), kBf16Tolerance) << "dv";
  if (!p.bias_table) return;
  std::vector<float> gpu_sums(gpu.bias_grad.size()), ref_sums(ref.bias_grad.size());
  for (std::size_t i = 0; i < gpu_sums.size(); ++i) {
    gpu_sums[i] = gpu.bias_grad[i] - p.bias_grad_initial[i];
    ref_sums[i] = ref.bias_grad[i] - p.bias_grad_initial[i];
  }
  EXPECT_LT(relative_error(gpu_sums, ref_sums), kBf16Tolerance) << "bias gradient (diagonal sums of dS)";
}

// Every (W, d) instantiation, T around the 64-row tiles, random bias table, both backward modes;
// a batch of 3 (Ĝ's reduction splits its terms by the batch size, fast_divisor.cuh).
TEST_P(FlashKernels, MatchDenseReferenceWithBiasTable) {
  const auto& [widths, seq_len, deterministic] = GetParam();
  expect_flash_matches_reference(make_kernel_problem(3, seq_len, 3, widths.first, widths.second, 77u + seq_len),
                                 deterministic);
}

// A linear bias handed over as slopes as well (ALiBi's path: the W = 64 kernels compute slope · Δ
// from the lag instead of reading the table, the others keep reading it): a steep slope, one
// that is not a power of two, and zero (ALiBi's unbiased heads).
TEST_P(FlashKernels, MatchDenseReferenceWithLinearBiasSlopes) {
  const auto& [widths, seq_len, deterministic] = GetParam();
  KernelProblem p = make_kernel_problem(2, seq_len, 3, widths.first, widths.second, 91u + seq_len);
  p.bias_slopes = {-0.5f, -0.70710678f / 64.0f, 0.0f};
  for (int h = 0; h < 3; ++h)
    for (int lag = 0; lag < seq_len; ++lag)
      p.bias[std::size_t(h) * seq_len + lag] = static_cast<float>(double(p.bias_slopes[h]) * lag);
  expect_flash_matches_reference(p, deterministic);
}

// No score bias, and scores that grow along the keys (every q̃ channel + 2, every k̃ channel
// + 0.0075·s at key s): each 64-key tile's maximum lies about 2^11 (W = 64) or 2^16 (W = 128) above
// the last one's, so the forward's optimistic exponentials (taken against the running maximum)
// fail their check (probabilities ≤ 2^8) in most tiles and the tile's scores are computed again
// (flash_forward_kernel). The growth sits mostly in q̃: a common offset of the keys cancels from
// dq̃ = Σ_s dS·k̃_s only in exact arithmetic (Σ_s dS = 0), not in bf16 dS, so with k̃ + 0.03·s
// dq̃'s error grew with T (1.09% at T = 200), a limit of bf16 dS rather than of these kernels.
TEST_P(FlashKernels, MatchDenseReferenceWithoutBiasWhenTheMaximumKeepsMoving) {
  const auto& [widths, seq_len, deterministic] = GetParam();
  KernelProblem p = make_kernel_problem(2, seq_len, 3, widths.first, widths.second, 53u + seq_len);
  p.bias_table = false;
  std::fill(p.bias.begin(), p.bias.end(), 0.0f);
  const std::size_t W = std::size_t(widths.first);
  auto rounded = [](float x) { return __bfloat162float(__float2bfloat16(x)); };
  for (std::size_t i = 0; i < p.q.size(); ++i) p.q[i] = rounded(p.q[i] + 2.0f);
  for (std::size_t i = 0; i < p.k.size(); ++i) {
    const std::size_t key = (i / W) % std::size_t(seq_len);  // [B·H, T, W]
    p.k[i] = rounded(p.k[i] + 0.0075f * float(key));
  }
  expect_flash_matches_reference(p, deterministic);
}

// A bias table whose largest values lie at middle lags (a tent rising 0.25 per lag from both
// ends; the third head's is a valley): the wgmma forward starts each head's visit at the end of
// its lags where the table is larger and takes the optimistic exponentials after the first key
// block, which fail as the tent's top comes into view (up to 0.25·T/2 nats above the first
// block's bias), so the tiles' scores are computed again.
TEST_P(FlashKernels, MatchDenseReferenceWithBiasTableWhenTheMaximumKeepsMoving) {
  const auto& [widths, seq_len, deterministic] = GetParam();
  KernelProblem p = make_kernel_problem(2, seq_len, 3, widths.first, widths.second, 61u + seq_len);
  for (int h = 0; h < 3; ++h)
    for (int lag = 0; lag < seq_len; ++lag)
      p.bias[std::size_t(h) * seq_len + lag] = (h == 2 ? -0.25f : 0.25f) * float(std::min(lag, seq_len - 1 - lag));
  expect_flash_matches_reference(p, deterministic);
}

// (qk_width, head_dim) pairs the fused kernels are instantiated for (kernels::kFlashWidths).
std::vector<std::pair<int, int>> flash_widths() {
  std::vector<std::pair<int, int>> widths;
  for (const kernels::FlashWidths& w : kernels::kFlashWidths) widths.emplace_back(w.qk_width, w.head_dim);
  return widths;
}

std::string flash_case_name(const ::testing::TestParamInfo<std::tuple<std::pair<int, int>, int, bool>>& info) {
  const std::pair<int, int> widths = std::get<0>(info.param);
  return fmt::format("W{}_d{}_T{}{}", widths.first, widths.second, std::get<1>(info.param),
                     std::get<2>(info.param) ? "" : "_atomic_dq");
}

INSTANTIATE_TEST_SUITE_P(Widths, FlashKernels,
                         ::testing::Combine(::testing::ValuesIn(flash_widths()), ::testing::Values(1, 63, 64, 65, 200),
                                            ::testing::Bool()),
                         flash_case_name);

// The atomic mode sums the same products as the query kernel in another order, from dS that the
// key kernel recomputed (S = k̃·q̃ᵀ rather than q̃·k̃ᵀ: an fp32 ulp apart at times, which can move a
// bf16-rounded dS by one bf16 ulp): dq̃ agrees to far below bf16 accuracy (seen: 1.3e-5 relative),
// and everything else (the key kernel's own outputs) bit for bit.
TEST_F(CudaAttention, FlashAtomicDqMatchesTheDeterministicBackward) {
  const KernelProblem p = make_kernel_problem(2, 333, 3, 128, 64, 21u);
  const KernelResult fixed = run_flash_kernels(p, true), atomic = run_flash_kernels(p, false);
  EXPECT_LT(relative_error(atomic.dq, fixed.dq), 1e-4);
  EXPECT_TRUE(bitwise_equal(atomic.dk, fixed.dk));
  EXPECT_TRUE(bitwise_equal(atomic.dv, fixed.dv));
  EXPECT_TRUE(bitwise_equal(atomic.bias_grad, fixed.bias_grad));
}

// The q/k transform's backward in the key and query kernels' epilogues gives dqkv bit for bit as
// the f32 dq̃, dk̃ rows followed by encode_qk_backward: identity and RoPE (every channel rotating,
// phase table at a position offset), W = d = 64 and 128, T around the tiles, with the problem's
// bias table (ALiBi and the PJ-bias methods take this path too). Other transforms and the
// atomic mode keep the separate pass.
TEST_F(CudaAttention, QkGradientsInTheEpilogueEqualTheSeparateBackwardBitwise) {
  for (const int head_dim : {64, 128})
    for (const int seq_len : {63, 65, 200})
      for (const bool rope : {false, true}) {
        SCOPED_TRACE(fmt::format("d {} T {} {}", head_dim, seq_len, rope ? "rope" : "identity"));
        KernelProblem p = make_kernel_problem(2, seq_len, 3, head_dim, head_dim, 5u + unsigned(seq_len));
        kernels::QkTransformParams transform;
        const int pairs = head_dim / 2;
        std::vector<double> omega(std::size_t(pairs), 0.0);
        for (int m = 0; m < pairs; ++m) omega[std::size_t(m)] = std::pow(10000.0, -double(m) / pairs);
        DeviceBuffer frequencies(omega.size() * sizeof(double)), phases(std::size_t(seq_len) * pairs * sizeof(float2));
        frequencies.upload(omega.data());
        if (rope) {
          transform.kind = kernels::QkTransformKind::rope;
          transform.rotary_pairs = pairs;
          transform.position_offset = 3000;
          transform.frequencies = static_cast<const double*>(frequencies.tensor(DType::f64, {}).data);
          auto* table = static_cast<float2*>(phases.tensor(DType::f32, {}).data);
          POPE_CUDA_CHECK(kernels::fill_phase_table(transform, seq_len, table, nullptr));
          transform.phases = table;
        }
        const KernelResult separate = run_flash_kernels(p, true, &transform, false);
        const KernelResult fused = run_flash_kernels(p, true, &transform, true);
        EXPECT_EQ(count_non_finite(fused.dqkv), 0u) << "dqkv has unwritten elements";
        EXPECT_TRUE(bitwise_equal(fused.dqkv, separate.dqkv));
      }
  const KernelProblem p = make_kernel_problem(1, 64, 1, 64, 64, 1u);
  kernels::EncodedAttention in;
  in.q = in.k = in.qkv = reinterpret_cast<const __nv_bfloat16*>(std::uintptr_t(256));
  in.score.scale = 0.125f;
  kernels::QkTransformParams identity, half_rope, pope;
  half_rope.kind = kernels::QkTransformKind::rope;
  half_rope.rotary_pairs = 16;
  half_rope.phases = reinterpret_cast<const float2*>(std::uintptr_t(256));
  pope.kind = kernels::QkTransformKind::pope;
  EXPECT_TRUE(kernels::flash_attention_fuses_qk_backward(p.dims, in, identity, true));
  EXPECT_FALSE(kernels::flash_attention_fuses_qk_backward(p.dims, in, identity, false)) << "atomic dq̃";
  EXPECT_FALSE(kernels::flash_attention_fuses_qk_backward(p.dims, in, half_rope, true)) << "half the channels";
  EXPECT_FALSE(kernels::flash_attention_fuses_qk_backward(p.dims, in, pope, true)) << "PoPE";
}

// dq̃, dk̃ written in bf16 (PoPE's 2d-wide features, W = 128, d = 64) are the f32 ones rounded,
// bit for bit, at T a tile multiple and not, with dv and Ĝ unchanged. Refused (an error, not
// wrong numbers) in the atomic mode and where W = d.
TEST_F(CudaAttention, RoundedEncodedGradientsAreTheFloatOnesRounded) {
  for (const int seq_len : {192, 131}) {
    SCOPED_TRACE(fmt::format("T {}", seq_len));
    const KernelProblem p = make_kernel_problem(2, seq_len, 3, 128, 64, 40u + unsigned(seq_len));
    const KernelResult full = run_flash_kernels(p), rounded = run_flash_kernels(p, true, nullptr, false, true);
    EXPECT_EQ(count_non_finite(rounded.dq), 0u) << "dq̃ has unwritten elements";
    EXPECT_EQ(count_non_finite(rounded.dk), 0u) << "dk̃ has unwritten elements";
    EXPECT_TRUE(bitwise_equal(rounded.dq, from_bf16(to_bf16(full.dq)))) << "dq̃";
    EXPECT_TRUE(bitwise_equal(rounded.dk, from_bf16(to_bf16(full.dk)))) << "dk̃";
    EXPECT_TRUE(bitwise_equal(rounded.dv, full.dv));
    EXPECT_TRUE(bitwise_equal(rounded.bias_grad, full.bias_grad));
  }
  EXPECT_THROW(run_flash_kernels(make_kernel_problem(1, 64, 1, 128, 64, 3u), false, nullptr, false, true), std::runtime_error)
      << "atomic mode";
  EXPECT_THROW(run_flash_kernels(make_kernel_problem(1, 64, 1, 64, 64, 3u), true, nullptr, false, true), std::runtime_error)
      << "W = d";
}

TEST_F(CudaAttention, FlashBackwardIsBitwiseDeterministic) {
  const KernelProblem p = make_kernel_problem(2, 333, 3, 128, 64, 21u);
  const KernelResult first = run_flash_kernels(p), second = run_flash_kernels(p);
  EXPECT_TRUE(bitwise_equal(first.dq, second.dq));
  EXPECT_TRUE(bitwise_equal(first.dk, second.dk));
  EXPECT_TRUE(bitwise_equal(first.dv, second.dv));
  EXPECT_TRUE(bitwise_equal(first.bias_grad, second.bias_grad));
}

// D = rowsum(dout ∘ out) for every row of [B, H, T]: the same fmaf chain over channels in
// order as the host's, bit for bit, with 16-byte groups (d = 64), with single values (d = 12)
// and with 16-byte-wide rows starting off a 16-byte boundary (one bf16 in: single values too).
TEST_F(CudaAttention, RowDotIsTheChannelOrderedChainBitwise) {
  for (const auto& [head_dim, lead] : {std::pair{64, 0}, std::pair{12, 0}, std::pair{64, 1}}) {
    SCOPED_TRACE(fmt::format("head_dim {} lead {}", head_dim, lead));
    const int B = 2, T = 37, H = 3;
    const kernels::AttentionDims dims{B, T, H, head_dim, head_dim};
    const std::size_t values = std::size_t(B) * T * H * head_dim, rows = std::size_t(B) * H * T;
    std::mt19937 engine(7u + unsigned(head_dim));
    std::vector<float> out = random_bf16_values(values + lead, -1.5f, 1.5f, engine);
    std::vector<float> dout = random_bf16_values(values + lead, -1.0f, 1.0f, engine);
    DeviceBuffer out_d(out.size() * 2), dout_d(dout.size() * 2), row_dot(rows * 4);
    out_d.upload(to_bf16(out).data());
    dout_d.upload(to_bf16(dout).data());
    row_dot.poison();
    kernels::AttentionGradients grads;
    grads.out = static_cast<const __nv_bfloat16*>(out_d.tensor(DType::bf16, {}).data) + lead;
    grads.dout = static_cast<const __nv_bfloat16*>(dout_d.tensor(DType::bf16, {}).data) + lead;
    grads.row_dot = static_cast<float*>(row_dot.tensor(DType::f32, {}).data);
    POPE_CUDA_CHECK(kernels::attention_row_dot(dims, grads, nullptr));
    std::vector<float> got(rows);
    row_dot.download(got.data());

    std::vector<float> expected(rows);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) {
          const std::size_t first = std::size_t(lead) + ((std::size_t(b) * T + t) * H + h) * head_dim;
          float sum = 0.0f;
          for (int c = 0; c < head_dim; ++c) sum = std::fmaf(dout[first + c], out[first + c], sum);
          expected[(std::size_t(b) * H + h) * T + t] = sum;
        }
    EXPECT_TRUE(bitwise_equal(got, expected));
  }
}

// T = 16384 (B = 1, H = 2, d = 64): the fused forward against the simple f32 kernels on the
// same encoded rows and bias table.
TEST_F(CudaAttention, FlashForwardAtLongContextMatchesSimpleKernels) {
  KernelProblem p = make_kernel_problem(1, 16384, 2, 64, 64, 5u);
  for (int h = 0; h < 2; ++h)  // an ALiBi-like decaying bias keeps the softmax from going uniform
    for (int lag = 0; lag < 16384; ++lag) p.bias[std::size_t(h) * 16384 + lag] = -0.01f * float(h + 1) * float(lag);
  DeviceBuffer q(p.q.size() * 2), k(p.k.size() * 2), qkv(p.qkv.size() * 2), bias(p.bias.size() * 4);
  DeviceBuffer out_flash(p.dout.size() * 2), out_simple(p.dout.size() * 2);
  DeviceBuffer lse_flash(p.statistics() * 4), lse_simple(p.statistics() * 4);
  q.upload(to_bf16(p.q).data());
  k.upload(to_bf16(p.k).data());
  qkv.upload(to_bf16(p.qkv).data());
  bias.upload(p.bias.data());
  for (DeviceBuffer* b : {&out_flash, &out_simple, &lse_flash, &lse_simple}) b->poison();
  kernels::EncodedAttention in;
  in.q = static_cast<const __nv_bfloat16*>(q.tensor(DType::bf16, {}).data);
  in.k = static_cast<const __nv_bfloat16*>(k.tensor(DType::bf16, {}).data);
  in.qkv = static_cast<const __nv_bfloat16*>(qkv.tensor(DType::bf16, {}).data);
  in.score.scale = p.scale;
  in.score.bias = static_cast<const float*>(bias.tensor(DType::f32, {}).data);
  auto bf16_data = [](DeviceBuffer& b) { return static_cast<__nv_bfloat16*>(b.tensor(DType::bf16, {}).data); };
  auto f32_data = [](DeviceBuffer& b) { return static_cast<float*>(b.tensor(DType::f32, {}).data); };
  POPE_CUDA_CHECK(kernels::flash_attention_forward(p.dims, in, bf16_data(out_flash), f32_data(lse_flash), nullptr));
  POPE_CUDA_CHECK(kernels::causal_attention_forward(p.dims, in, bf16_data(out_simple), f32_data(lse_simple), nullptr));
  POPE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<__nv_bfloat16> staging(p.dout.size());
  out_flash.download(staging.data());
  const std::vector<float> flash = from_bf16(staging);
  out_simple.download(staging.data());
  const std::vector<float> simple = from_bf16(staging);
  std::vector<float> flash_lse(p.statistics()), simple_lse(p.statistics());
  lse_flash.download(flash_lse.data());
  lse_simple.download(simple_lse.data());
  EXPECT_EQ(count_non_finite(flash), 0u);
  EXPECT_EQ(count_non_finite(flash_lse), 0u);
  EXPECT_LT(relative_error(flash, simple), kBf16Tolerance) << "out";
  EXPECT_LT(relative_error(flash_lse, simple_lse), kLseTolerance) << "lse";
}

TEST_F(CudaAttention, BiasGradientNeedsAScoreBias) {
  const EncodingCase nope = variant_cases()[0];
  const Problem problem = make_problem(nope, 1, 8, 1, 64, 3u);
  cuda::AttentionRunner runner;
  DeviceBuffer qkv(problem.qkv.size() * 2), out(problem.dout.size() * 2), dout(problem.dout.size() * 2),
      dqkv(problem.qkv.size() * 2), lse(8 * 4), grad(8 * 4);
  AttentionBackward args;
  args.shape = problem.shape;
  args.encoding = problem.encoding.get();
  args.position = problem.ctx;
  args.qkv = qkv.tensor(DType::bf16, {8, 192});
  args.out = out.tensor(DType::bf16, {8, 64});
  args.lse = lse.tensor(DType::f32, {1, 1, 8});
  args.dout = dout.tensor(DType::bf16, {8, 64});
  args.dqkv = dqkv.tensor(DType::bf16, {8, 192});
  float* bias_grad = static_cast<float*>(grad.tensor(DType::f32, {8}).data);
  const std::string message =
      message_of<std::invalid_argument>([&] { runner.backward(args, nullptr, bias_grad); });
  EXPECT_NE(message.find("no score bias"), std::string::npos) << message;
}

TEST_F(CudaAttention, UnknownEncodingIsNamed) {
  SmallCall call;
  MysteryEncoding mystery;
  call.args.encoding = &mystery;
  cuda::AttentionRunner runner;
  EXPECT_NE(message_of<std::runtime_error>([&] { runner.forward(call.args, nullptr); }).find("'mystery'"),
            std::string::npos);
}

TEST_F(CudaAttention, BadTensorsAreNamed) {
  cuda::AttentionRunner runner;
  {
    SmallCall call;
    std::vector<float> host(16 * 192);
    call.args.qkv = host_tensor(host, {16, 192});
    const std::string message = message_of<std::invalid_argument>([&] { runner.forward(call.args, nullptr); });
    EXPECT_NE(message.find("qkv"), std::string::npos) << message;
    EXPECT_NE(message.find("lives on cpu"), std::string::npos) << message;
  }
  {
    SmallCall call;
    call.args.lse = call.lse.tensor(DType::bf16, {2, 1, 8});
    EXPECT_NE(message_of<std::invalid_argument>([&] { runner.forward(call.args, nullptr); }).find("lse"),
              std::string::npos);
  }
  {
    SmallCall call;
    call.args.position.seq_len = 9;
    EXPECT_NE(message_of<std::invalid_argument>([&] { runner.forward(call.args, nullptr); }).find("seq_len"),
              std::string::npos);
  }
  {
    SmallCall call;
    PopeEncoding pope{PopeConfig{}};  // learns δ, but no parameter tensor is passed
    call.args.encoding = &pope;
    EXPECT_NE(message_of<std::invalid_argument>([&] { runner.forward(call.args, nullptr); }).find("position_params"),
              std::string::npos);
  }
  {
    SmallCall call;  // room for q̃ only, not q̃ and k̃
    DeviceBuffer encoded(std::size_t(16 * 64) * 2);
    call.args.encoded = encoded.tensor(DType::bf16, {16 * 64});
    const std::string message = message_of<std::invalid_argument>([&] { runner.forward(call.args, nullptr); });
    EXPECT_NE(message.find("encoded"), std::string::npos) << message;
  }
}

}  // namespace
