// PJ-rotary's q/k transform on the GPU (kernels/attention/qk_transform.cu, the plan that
// src/cuda/cuda_attention.cpp builds) against the CPU encoding (src/position/pj_rotary.cpp,
// double): forward q̃, k̃ and the backward dq, dk from random f32 gradients, for jet orders
// 0, 1, 2, 3 and 5 (every register bound of the kernels), head dims 8..128, odd lengths and
// lengths that are no tile multiple, an evaluation offset (large angles) and positions far
// past L_train (large shears); then the spec's golden q̃ at t = 9 and scores through the GPU
// transform, and the kernels' refusal of plans they cannot run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "attention/qk_transform.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda_op_test_support.hpp"
#include "position/encodings.hpp"

namespace {

using namespace pope;
using pope::test::download;
using pope::test::make_tensor;
using pope::test::random_bf16_values;
using pope::test::relative_error;

// q̃, k̃ and dq, dk are f32 math rounded once to bf16 (relative error ≤ 2⁻⁸ per element, about
// 1.7e-3 RMS over a vector); angles and shears agree with the CPU's double to f32 accuracy. A wrong shear entry or
// rotation direction gives errors of order 1.
constexpr double kBf16Tolerance = 4e-3;

struct Case {
  int order;
  int head_dim;
  int seq_len;
  int batch = 2;
  int n_head = 3;
  int position_offset = 0;
  int train_length = 1024;
  double base = 10000.0;
};

std::string case_name(const Case& c) {
  std::string name = "K";
  for (const auto& [label, value] : {std::pair<const char*, int>{"", c.order}, {"_d", c.head_dim}, {"_T", c.seq_len},
                                     {"_offset", c.position_offset}, {"_L", c.train_length}})
    name.append(label).append(std::to_string(value));
  return name;
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

PjConfig rotary_config(int order, double base) {
  PjConfig config;
  config.rotary_order = order;
  config.rotary_base = base;
  return config;
}

// The encoded rows and the q, k blocks of dqkv, on the host as double.
struct Encoded {
  std::vector<double> q, k, dqkv;
};

// One forward and backward of the transform on the GPU, planned as AttentionRunner plans it.
Encoded run_on_gpu(const PjRotaryEncoding& rotary, const PositionContext& ctx, int batch,
                   const std::vector<float>& qkv_values, const std::vector<float>& dq_values,
                   const std::vector<float>& dk_values) {
  auto gpu = make_backend(DeviceChoice::cuda);
  const int T = ctx.seq_len, H = ctx.n_head, d = ctx.head_dim;
  const std::int64_t rows = std::int64_t(batch) * T, C = std::int64_t(H) * d, encoded = rows * C;
  const OwnedTensor qkv = make_tensor(*gpu, {rows, 3 * C}, DType::bf16, qkv_values);
  const OwnedTensor dq = make_tensor(*gpu, {encoded}, DType::f32, dq_values);
  const OwnedTensor dk = make_tensor(*gpu, {encoded}, DType::f32, dk_values);
  const OwnedTensor q_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
  const OwnedTensor k_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
  const OwnedTensor dqkv = allocate_tensor(*gpu, {rows, 3 * C}, DType::bf16);
  pope::test::poison(*gpu, q_encoded.tensor);
  pope::test::poison(*gpu, k_encoded.tensor);
  pope::test::poison(*gpu, dqkv.tensor);
  gpu->synchronize();  // the backend's stream does not order itself with the default stream the kernels run on
  const std::vector<double> omega = rotary.frequencies(d);
  const OwnedTensor frequencies = allocate_tensor(*gpu, {std::int64_t(omega.size())}, DType::f64);
  gpu->copy_from_host(frequencies.tensor, omega.data());

  const kernels::AttentionDims dims{.batch = batch, .seq_len = T, .n_head = H, .head_dim = d, .qk_width = d};
  kernels::QkTransformParams plan;
  plan.kind = kernels::QkTransformKind::pj_rotary;
  plan.position_offset = ctx.position_offset;
  plan.jet_order = rotary.order();
  plan.frequencies = static_cast<const double*>(frequencies.tensor.data);
  plan.shear_rate = rotary.shear_rate(ctx, "test");
  const auto* qkv_device = static_cast<const __nv_bfloat16*>(qkv.tensor.data);
  POPE_CUDA_CHECK(kernels::encode_qk(dims, plan, qkv_device, static_cast<__nv_bfloat16*>(q_encoded.tensor.data),
                                     static_cast<__nv_bfloat16*>(k_encoded.tensor.data), nullptr));
  POPE_CUDA_CHECK(kernels::encode_qk_backward(dims, plan, qkv_device, static_cast<const float*>(dq.tensor.data),
                                              static_cast<const float*>(dk.tensor.data),
                                              static_cast<__nv_bfloat16*>(dqkv.tensor.data), nullptr));
  POPE_CUDA_CHECK(cudaDeviceSynchronize());
  return {download(*gpu, q_encoded.tensor), download(*gpu, k_encoded.tensor), download(*gpu, dqkv.tensor)};
}

// The same on the CPU in double, per (batch, head) as the CPU backend calls the encoding. The
// v block of dqkv is left NaN, as the GPU leaves it unwritten.
Encoded run_on_cpu(const PjRotaryEncoding& rotary, const PositionContext& ctx, int batch,
                   const std::vector<float>& qkv_values, const std::vector<float>& dq_values,
                   const std::vector<float>& dk_values) {
  const int T = ctx.seq_len, H = ctx.n_head, d = ctx.head_dim;
  const std::int64_t C = std::int64_t(H) * d, stride = 3 * C;
  const std::vector<double> qkv(qkv_values.begin(), qkv_values.end());
  const std::vector<double> dq(dq_values.begin(), dq_values.end()), dk(dk_values.begin(), dk_values.end());
  Encoded cpu;
  cpu.q.resize(dq.size());
  cpu.k.resize(dk.size());
  cpu.dqkv.assign(qkv.size(), std::numeric_limits<double>::quiet_NaN());
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < H; ++h)
      for (const bool is_key : {false, true}) {
        const std::int64_t in = std::int64_t(b) * T * stride + (is_key ? C : 0) + std::int64_t(h) * d;
        const std::int64_t out = (std::int64_t(b) * H + h) * T * d;
        QkTransformArgs<double> forward;
        forward.ctx = &ctx;
        forward.head = h;
        forward.is_key = is_key;
        forward.x = qkv.data() + in;
        forward.x_stride = stride;
        forward.y = (is_key ? cpu.k : cpu.q).data() + out;
        rotary.transform_qk(forward);
        for (int t = 0; t < T; ++t)
          for (int c = 0; c < d; ++c) cpu.dqkv[std::size_t(in + t * stride + c)] = 0.0;  // the hook accumulates
        QkTransformBackwardArgs<double> backward;
        backward.ctx = &ctx;
        backward.head = h;
        backward.is_key = is_key;
        backward.x = forward.x;
        backward.x_stride = stride;
        backward.dy = (is_key ? dk : dq).data() + out;
        backward.dx = cpu.dqkv.data() + in;
        backward.dx_stride = stride;
        rotary.transform_qk_backward(backward);
      }
  return cpu;
}

// relative_error over the q (block 0) or k (block 1) columns of every dqkv row.
double block_error(const std::vector<double>& got, const std::vector<double>& want, std::int64_t C, int block) {
  std::vector<double> got_block, want_block;
  for (std::size_t row = 0; row < want.size(); row += std::size_t(3 * C))
    for (std::int64_t c = block * C; c < (block + 1) * C; ++c) {
      got_block.push_back(got[row + std::size_t(c)]);
      want_block.push_back(want[row + std::size_t(c)]);
    }
  return relative_error(got_block, want_block);
}

class CudaPjRotary : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaPjRotary, TransformAndBackwardMatchTheCpuEncoding) {
  const Case& c = GetParam();
  const PjRotaryEncoding rotary(rotary_config(c.order, c.base));
  PositionContext ctx;
  ctx.seq_len = c.seq_len;
  ctx.train_length = c.train_length;
  ctx.n_head = c.n_head;
  ctx.head_dim = c.head_dim;
  ctx.position_offset = c.position_offset;
  const std::size_t rows = std::size_t(c.batch) * c.seq_len, C = std::size_t(c.n_head) * c.head_dim;
  const std::uint64_t seed = 17u * std::uint64_t(c.order + 1) + std::uint64_t(c.seq_len);
  const std::vector<float> qkv = random_bf16_values(rows * 3 * C, seed);
  const std::vector<float> dq = random_bf16_values(rows * C, seed + 1), dk = random_bf16_values(rows * C, seed + 2);
  const Encoded gpu = run_on_gpu(rotary, ctx, c.batch, qkv, dq, dk);
  const Encoded cpu = run_on_cpu(rotary, ctx, c.batch, qkv, dq, dk);
  EXPECT_LT(relative_error(gpu.q, cpu.q), kBf16Tolerance) << "q̃";
  EXPECT_LT(relative_error(gpu.k, cpu.k), kBf16Tolerance) << "k̃";
  EXPECT_LT(block_error(gpu.dqkv, cpu.dqkv, std::int64_t(C), 0), kBf16Tolerance) << "dq";
  EXPECT_LT(block_error(gpu.dqkv, cpu.dqkv, std::int64_t(C), 1), kBf16Tolerance) << "dk";
  // The v block is not the transform's: it must stay as it was (NaN poison).
  for (std::size_t row = 0; row < gpu.dqkv.size(); row += 3 * C)
    for (std::size_t i = 2 * C; i < 3 * C; ++i) ASSERT_TRUE(std::isnan(gpu.dqkv[row + i])) << "v block written";
}

INSTANTIATE_TEST_SUITE_P(
    OrdersAndShapes, CudaPjRotary,
    ::testing::Values(Case{1, 64, 1}, Case{1, 64, 37}, Case{1, 64, 65}, Case{1, 128, 200, 1, 2},
                      // positions far past L_train: shears c_p up to 12 (norms grow ~13×)
                      Case{1, 64, 197, 2, 3, 0, 16},
                      // an evaluation window at offset 9000: angles of thousands of radians
                      Case{1, 64, 63, 2, 3, 9000, 1024}, Case{0, 64, 63}, Case{2, 48, 37}, Case{2, 96, 130, 1, 2},
                      Case{3, 64, 65}, Case{3, 128, 33, 1, 2, 500, 256}, Case{5, 96, 37, 1, 2}),
    [](const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); });

// Spec 5.2's golden example (K = 1, one block with ω = 0.37, η = 1, L = 16): the example sits in
// block 1 of an 8-dim head (ω_1 = base^(−1/2) = 0.37 for base 1/0.37²; block 0 is zero), with q
// and k at every position. The inputs are rounded to bf16 (0.2 → 0.2002) and q̃, k̃ stored in
// bf16, so the values agree to a few 1e-3.
TEST(CudaPjRotaryGolden, QueryFeatureAndScoresThroughTheGpuTransform) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr double kGoldenTolerance = 6e-3;
  const PjRotaryEncoding rotary(rotary_config(1, 1.0 / (0.37 * 0.37)));
  PositionContext ctx;
  ctx.seq_len = 21;
  ctx.train_length = 16;
  ctx.n_head = 1;
  ctx.head_dim = 8;
  const float q[4] = {0.2f, -0.3f, 0.5f, 0.7f}, k[4] = {-0.6f, 0.1f, 0.3f, -0.4f};
  std::vector<float> qkv(std::size_t(ctx.seq_len) * 24, 0.0f);
  for (int t = 0; t < ctx.seq_len; ++t)
    for (int i = 0; i < 4; ++i) {
      qkv[std::size_t(t) * 24 + 4 + i] = q[i];
      qkv[std::size_t(t) * 24 + 8 + 4 + i] = k[i];
    }
  const std::vector<float> zero_grad(std::size_t(ctx.seq_len) * 8, 0.0f);
  const Encoded gpu = run_on_gpu(rotary, ctx, 1, qkv, zero_grad, zero_grad);
  const double expected_q9[4] = {-0.455174818, -0.182226536, -0.360045624, -0.781259975};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(gpu.q[9 * 8 + i], 0.0) << "block 0 of q̃ at t = 9, element " << i;
    EXPECT_NEAR(gpu.q[9 * 8 + 4 + i], expected_q9[i], kGoldenTolerance) << "q̃ at t = 9, element " << i;
  }
  const auto score = [&](int t, int s) {
    double sum = 0.0;
    for (int i = 0; i < 8; ++i) sum += gpu.q[std::size_t(t) * 8 + i] * gpu.k[std::size_t(s) * 8 + i];
    return sum;
  };
  EXPECT_NEAR(score(9, 4), -0.309766252158, kGoldenTolerance);
  EXPECT_NEAR(score(5, 0), -0.309766252158, kGoldenTolerance);
  EXPECT_NEAR(score(4, 4), -0.28, kGoldenTolerance);
  EXPECT_NEAR(score(20, 3), -0.524844108005, kGoldenTolerance);
}

// Plans the kernels cannot run are refused with cudaErrorInvalidValue before any launch.
TEST(CudaPjRotaryPlan, RejectsOrdersAndWidthsItCannotRun) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_backend(DeviceChoice::cuda);
  const kernels::AttentionDims dims{.batch = 1, .seq_len = 4, .n_head = 1, .head_dim = 64, .qk_width = 64};
  const OwnedTensor qkv = allocate_tensor(*gpu, {4, 192}, DType::bf16);
  const OwnedTensor q = allocate_tensor(*gpu, {256}, DType::bf16), k = allocate_tensor(*gpu, {256}, DType::bf16);
  const OwnedTensor frequencies = allocate_tensor(*gpu, {32}, DType::f64);
  kernels::QkTransformParams plan;
  plan.kind = kernels::QkTransformKind::pj_rotary;
  plan.frequencies = static_cast<const double*>(frequencies.tensor.data);
  const auto encode = [&](const kernels::AttentionDims& shape, const kernels::QkTransformParams& p) {
    return kernels::encode_qk(shape, p, static_cast<const __nv_bfloat16*>(qkv.tensor.data),
                              static_cast<__nv_bfloat16*>(q.tensor.data), static_cast<__nv_bfloat16*>(k.tensor.data),
                              nullptr);
  };
  plan.jet_order = kernels::kPjRotaryMaxOrder + 1;
  EXPECT_EQ(encode(dims, plan), cudaErrorInvalidValue) << "order past the bound";
  plan.jet_order = -1;
  EXPECT_EQ(encode(dims, plan), cudaErrorInvalidValue) << "negative order";
  plan.jet_order = 2;  // blocks of 6 dims do not divide 64
  EXPECT_EQ(encode(dims, plan), cudaErrorInvalidValue) << "block width not dividing head_dim";
  plan.jet_order = 1;
  plan.frequencies = nullptr;
  EXPECT_EQ(encode(dims, plan), cudaErrorInvalidValue) << "no frequency table";
  plan.frequencies = static_cast<const double*>(frequencies.tensor.data);
  EXPECT_EQ(encode(dims, plan), cudaSuccess);
  POPE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
