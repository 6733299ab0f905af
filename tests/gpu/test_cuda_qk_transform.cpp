// The q/k transform kernels' own contracts, beside the attention tests against the CPU:
// - RoPE's phase table (kernels::fill_phase_table, read through QkTransformParams::phases) gives
//   the q̃, k̃, dq and dk of the angles formed per (position, pair), bit for bit, with every
//   channel and with half of them rotating, at position offsets 0 and 9,000;
// - PoPE over a batch of 10 (two slices of the kernels' up to 8 sequences, the second short),
//   with vector groups (d = 64) and single channels (d = 12), T not a multiple of a block's
//   positions: q̃, k̃ and the keys' dL/dk against the host's formulas; the δ pass
//   (kernels::pope_delta_gradient) writes dL/dk exactly as encode_qk_backward does and
//   accumulates dL/dδ = Σ over batch and positions of the keys' phase gradients (against a double
//   sum on the host), none for δ outside [−2π, 0] when δ is clamped; unclamped (delta_bound
//   none), k̃ takes δ as stored and every δ its gradient. The tolerance, 1e-4 of Σ|term|, is
//   13× below one average term (B·T = 770 of them), so a wrong, missing or doubled (b, t) term
//   fails it.
//   Both take dq̃, dk̃ in bf16 too (as the fused attention leaves PoPE's) and give bit for bit
//   what they give from the same values in f32;
// - encode_keys, between a key cache's rows, gives encode_qk's k̃ bit for bit.
// Reports SKIPPED without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/qk_transform.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda_op_test_support.hpp"

namespace {

using namespace pope;
using kernels::QkTransformKind;

// Equal element by element, NaN matching NaN (blocks of dqkv a call leaves alone stay poisoned).
bool same_numbers(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

std::vector<double> frequencies_of(int count) {
  std::vector<double> omega(static_cast<std::size_t>(count));
  for (int m = 0; m < count; ++m) omega[std::size_t(m)] = std::pow(10000.0, -double(m) / count);
  return omega;
}

const float* f32_data(const OwnedTensor& t) { return static_cast<const float*>(t.tensor.data); }
__nv_bfloat16* bf16_data(const OwnedTensor& t) { return static_cast<__nv_bfloat16*>(t.tensor.data); }

TEST(CudaQkTransform, RopePhaseTableGivesThePerPositionTransformExactly) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_backend(DeviceChoice::cuda);
  const int B = 2, T = 77, H = 3, d = 64;
  struct Case {
    const char* name;
    int rotary_pairs;
    int position_offset;
  };
  for (const Case& c : {Case{"every channel", d / 2, 0}, Case{"half the channels", d / 4, 9000}}) {
    SCOPED_TRACE(c.name);
    const std::int64_t rows = std::int64_t(B) * T, C = std::int64_t(H) * d, encoded = std::int64_t(B) * H * T * d;
    const OwnedTensor qkv = test::make_tensor(*gpu, {rows, 3 * C}, DType::bf16, test::random_bf16_values(rows * 3 * C, 1));
    const OwnedTensor dq = test::make_tensor(*gpu, {encoded}, DType::f32, test::random_bf16_values(encoded, 2));
    const OwnedTensor dk = test::make_tensor(*gpu, {encoded}, DType::f32, test::random_bf16_values(encoded, 3));
    const std::vector<double> omega = frequencies_of(c.rotary_pairs);
    const OwnedTensor frequencies = allocate_tensor(*gpu, {c.rotary_pairs}, DType::f64);
    gpu->copy_from_host(frequencies.tensor, omega.data());

    const kernels::AttentionDims dims{.batch = B, .seq_len = T, .n_head = H, .head_dim = d, .qk_width = d};
    kernels::QkTransformParams plan;
    plan.kind = QkTransformKind::rope;
    plan.position_offset = c.position_offset;
    plan.rotary_pairs = c.rotary_pairs;
    plan.frequencies = static_cast<const double*>(frequencies.tensor.data);
    const std::size_t entries = kernels::phase_table_entries(plan, T);
    EXPECT_EQ(entries, std::size_t(T) * std::size_t(c.rotary_pairs));
    const OwnedTensor table = allocate_tensor(*gpu, {std::int64_t(2 * entries)}, DType::f32);
    gpu->synchronize();  // the kernels below run on the default stream
    struct Outputs {
      std::vector<double> q, k, dqkv;
    };
    auto run = [&](const kernels::QkTransformParams& p) {
      const OwnedTensor q_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
      const OwnedTensor k_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
      const OwnedTensor dqkv = allocate_tensor(*gpu, {rows, 3 * C}, DType::bf16);
      test::poison(*gpu, dqkv.tensor);
      gpu->synchronize();
      const auto* source = static_cast<const __nv_bfloat16*>(qkv.tensor.data);
      POPE_CUDA_CHECK(kernels::encode_qk(dims, p, source, bf16_data(q_encoded), bf16_data(k_encoded), nullptr));
      POPE_CUDA_CHECK(
          kernels::encode_qk_backward(dims, p, source, f32_data(dq), f32_data(dk), bf16_data(dqkv), nullptr));
      POPE_CUDA_CHECK(cudaDeviceSynchronize());
      return Outputs{test::download(*gpu, q_encoded.tensor), test::download(*gpu, k_encoded.tensor),
                     test::download(*gpu, dqkv.tensor)};
    };
    const Outputs per_position = run(plan);
    kernels::QkTransformParams tabulated = plan;
    auto* phases = static_cast<float2*>(table.tensor.data);
    POPE_CUDA_CHECK(kernels::fill_phase_table(plan, T, phases, nullptr));
    tabulated.phases = phases;
    const Outputs from_table = run(tabulated);
    EXPECT_TRUE(same_numbers(per_position.q, from_table.q)) << "q̃";
    EXPECT_TRUE(same_numbers(per_position.k, from_table.k)) << "k̃";
    EXPECT_TRUE(same_numbers(per_position.dqkv, from_table.dqkv)) << "dq, dk";
    // The kernels do read the table: zeroed entries (cos = sin = 0) change q̃.
    POPE_CUDA_CHECK(cudaMemset(phases, 0, entries * sizeof(float2)));
    EXPECT_FALSE(same_numbers(per_position.q, run(tabulated).q)) << "q̃ did not change with a zeroed table";
  }
}

// kernels::encode_keys gives encode_qk's k̃ bit for bit between a key cache's rows: from qkv's k
// columns into rows [r0, r0 + T) of a cache, and (as dynamic NTK's decode does) from there
// copied raw (identity) into a cache of raw keys and encoded again from it with the positions
// counted from its row 0. RoPE with vector groups (d = 64), single channels (d = 12) and half the
// channels rotating, and PoPE (twice as wide, δ on keys), over two slices of the batch; the cache
// rows outside the call stay as they were.
TEST(CudaQkTransform, EncodeKeysIntoACacheGiveEncodeQksKeys) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_backend(DeviceChoice::cuda);
  const int B = 10, T = 37, H = 3, capacity = 50, r0 = 9;
  struct Case {
    const char* name;
    QkTransformKind kind;
    int d, rotary_pairs;
  };
  for (const Case& c :
       {Case{"rope d 64", QkTransformKind::rope, 64, 32}, Case{"rope d 12", QkTransformKind::rope, 12, 6},
        Case{"rope, half rotating", QkTransformKind::rope, 64, 16}, Case{"pope d 64", QkTransformKind::pope, 64, 0}}) {
    SCOPED_TRACE(c.name);
    const int d = c.d, W = c.kind == QkTransformKind::pope ? 2 * d : d;
    const std::int64_t rows = std::int64_t(B) * T, C = std::int64_t(H) * d;
    const OwnedTensor qkv =
        test::make_tensor(*gpu, {rows, 3 * C}, DType::bf16, test::random_bf16_values(rows * 3 * C, 9));
    const OwnedTensor delta =
        test::make_tensor(*gpu, {H * d}, DType::f32, test::random_bf16_values(std::size_t(H) * d, 10));
    const std::vector<double> omega = frequencies_of(c.kind == QkTransformKind::pope ? d : c.rotary_pairs);
    const OwnedTensor frequencies = allocate_tensor(*gpu, {std::int64_t(omega.size())}, DType::f64);
    gpu->copy_from_host(frequencies.tensor, omega.data());
    kernels::QkTransformParams plan;
    plan.kind = c.kind;
    plan.position_offset = r0;
    plan.rotary_pairs = c.rotary_pairs;
    plan.frequencies = static_cast<const double*>(frequencies.tensor.data);
    if (c.kind == QkTransformKind::pope) plan.delta = f32_data(delta);

    const kernels::AttentionDims dims{.batch = B, .seq_len = T, .n_head = H, .head_dim = d, .qk_width = W};
    const std::int64_t encoded = std::int64_t(B) * H * T * W;
    const OwnedTensor q_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
    const OwnedTensor k_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
    const OwnedTensor keys = allocate_tensor(*gpu, {B, H, capacity, W}, DType::bf16);
    const OwnedTensor raw = allocate_tensor(*gpu, {B, H, capacity, d}, DType::bf16);
    const OwnedTensor again = allocate_tensor(*gpu, {B, H, capacity, W}, DType::bf16);
    for (const OwnedTensor* t : {&keys, &raw, &again}) test::poison(*gpu, t->tensor);
    gpu->synchronize();  // the kernels below run on the default stream
    const auto* source = static_cast<const __nv_bfloat16*>(qkv.tensor.data);
    POPE_CUDA_CHECK(kernels::encode_qk(dims, plan, source, bf16_data(q_encoded), bf16_data(k_encoded), nullptr));
    const kernels::RowLayout key_rows = kernels::cache_rows(H, capacity, W);
    const kernels::RowLayout raw_rows = kernels::cache_rows(H, capacity, d);
    POPE_CUDA_CHECK(kernels::encode_keys(dims, plan, source + C, kernels::qkv_rows(dims), bf16_data(keys) + r0 * W,
                                         key_rows, nullptr));
    kernels::AttentionDims raw_dims = dims;
    raw_dims.qk_width = d;
    POPE_CUDA_CHECK(kernels::encode_keys(raw_dims, kernels::QkTransformParams{}, source + C, kernels::qkv_rows(dims),
                                         bf16_data(raw) + r0 * d, raw_rows, nullptr));
    kernels::AttentionDims cached = dims;
    cached.seq_len = r0 + T;  // rows [0, r0) of `raw` hold NaN, and so will those of `again`
    kernels::QkTransformParams from_zero = plan;
    from_zero.position_offset = 0;
    POPE_CUDA_CHECK(
        kernels::encode_keys(cached, from_zero, bf16_data(raw), raw_rows, bf16_data(again), key_rows, nullptr));
    POPE_CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<double> host_qkv = test::download(*gpu, qkv.tensor);
    const std::vector<double> want = test::download(*gpu, k_encoded.tensor);
    const std::vector<double> got = test::download(*gpu, keys.tensor), got_raw = test::download(*gpu, raw.tensor),
                              got_again = test::download(*gpu, again.tensor);
    std::size_t wrong = 0, wrong_raw = 0, wrong_again = 0, written_outside = 0;
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int row = 0; row < capacity; ++row) {
          const int t = row - r0;
          const std::size_t slot = (std::size_t(b) * H + h) * capacity + row;
          for (int ch = 0; ch < W; ++ch) {
            const double key = got[slot * W + ch];
            if (t < 0 || t >= T) {
              written_outside += !std::isnan(key) + (ch < d && !std::isnan(got_raw[slot * d + ch]));
              continue;
            }
            const double k = want[((std::size_t(b) * H + h) * T + t) * W + ch];
            wrong += key != k;
            wrong_again += got_again[slot * W + ch] != k;
            if (ch < d) {
              const std::size_t x = (std::size_t(b) * T + t) * 3 * C + C + std::size_t(h) * d + ch;
              wrong_raw += got_raw[slot * d + ch] != host_qkv[x];
            }
          }
        }
    EXPECT_EQ(wrong, 0u) << "k̃ from qkv into the cache";
    EXPECT_EQ(wrong_raw, 0u) << "raw keys copied into the cache";
    EXPECT_EQ(wrong_again, 0u) << "k̃ encoded again from the raw keys";
    EXPECT_EQ(written_outside, 0u) << "cache rows outside [r0, r0 + T) written";
  }
}

double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

double softplus_derivative(double x) { return x > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-x)); }

// |got − want| within bf16's rounding of want (8 significant bits) plus float noise.
void expect_bf16_of(double got, double want, const char* what, std::size_t at) {
  EXPECT_NEAR(got, want, std::ldexp(std::fabs(want), -8) + 1e-5) << what << " element " << at;
}

TEST(CudaQkTransform, PopeKernelsMatchTheHostOverBatchSlices) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_backend(DeviceChoice::cuda);
  const int B = 10, T = 77, H = 2, offset = 9000;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  struct Case {
    int d;             // 64: vector groups; 12: single channels
    bool clamp_delta;  // delta_bound clamp, or none
  };
  for (const Case& c : {Case{64, true}, Case{12, true}, Case{64, false}, Case{12, false}}) {
    const int d = c.d;
    const bool clamp_delta = c.clamp_delta;
    SCOPED_TRACE("head_dim " + std::to_string(d) + (clamp_delta ? ", δ clamped" : ", δ unbounded"));
    const int W = 2 * d;
    const std::int64_t rows = std::int64_t(B) * T, C = std::int64_t(H) * d, encoded = std::int64_t(B) * H * T * W;
    const std::vector<float> qkv_values = test::random_bf16_values(rows * 3 * C, 5);
    const std::vector<float> dk_values = test::random_bf16_values(encoded, 6);
    std::vector<float> delta_values = test::random_bf16_values(std::size_t(H) * d, 7, 3.0f);
    for (float& v : delta_values) v = -std::fabs(v);  // mostly inside [−2π, 0], some past −2π
    delta_values[1] = 0.5f;                           // above the range too
    const OwnedTensor qkv = test::make_tensor(*gpu, {rows, 3 * C}, DType::bf16, qkv_values);
    const std::vector<float> dq_values = test::random_bf16_values(encoded, 8);
    const OwnedTensor dq = test::make_tensor(*gpu, {encoded}, DType::f32, dq_values);
    const OwnedTensor dk = test::make_tensor(*gpu, {encoded}, DType::f32, dk_values);
    const OwnedTensor delta = test::make_tensor(*gpu, {H * d}, DType::f32, delta_values);
    const std::vector<double> omega = frequencies_of(d);
    const OwnedTensor frequencies = allocate_tensor(*gpu, {d}, DType::f64);
    gpu->copy_from_host(frequencies.tensor, omega.data());
    const OwnedTensor partials =
        allocate_tensor(*gpu, {std::int64_t(kernels::pope_delta_gradient_partial_floats(
                                  {.batch = B, .seq_len = T, .n_head = H, .head_dim = d, .qk_width = W}))},
                        DType::f32);
    const OwnedTensor delta_grad =
        test::make_tensor(*gpu, {H * d}, DType::f32, std::vector<float>(std::size_t(H) * d, 1.0f));  // accumulated into

    const kernels::AttentionDims dims{.batch = B, .seq_len = T, .n_head = H, .head_dim = d, .qk_width = W};
    kernels::QkTransformParams plan;
    plan.kind = QkTransformKind::pope;
    plan.position_offset = offset;
    plan.frequencies = static_cast<const double*>(frequencies.tensor.data);
    plan.delta = f32_data(delta);
    plan.clamp_delta = clamp_delta;
    const auto* source = static_cast<const __nv_bfloat16*>(qkv.tensor.data);
    const auto acting_delta = [&](float delta_hc) {
      return clamp_delta ? std::clamp(double(delta_hc), -kTwoPi, 0.0) : double(delta_hc);
    };
    const OwnedTensor q_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
    const OwnedTensor k_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
    const OwnedTensor by_encode = allocate_tensor(*gpu, {rows, 3 * C}, DType::bf16);
    const OwnedTensor by_delta = allocate_tensor(*gpu, {rows, 3 * C}, DType::bf16);
    test::poison(*gpu, by_encode.tensor);
    test::poison(*gpu, by_delta.tensor);
    gpu->synchronize();
    POPE_CUDA_CHECK(kernels::encode_qk(dims, plan, source, bf16_data(q_encoded), bf16_data(k_encoded), nullptr));
    POPE_CUDA_CHECK(
        kernels::encode_qk_backward(dims, plan, source, f32_data(dq), f32_data(dk), bf16_data(by_encode), nullptr));
    POPE_CUDA_CHECK(kernels::encode_qk_backward(dims, plan, source, f32_data(dq), nullptr, bf16_data(by_delta), nullptr));
    POPE_CUDA_CHECK(kernels::pope_delta_gradient(dims, plan, source, f32_data(dk),
                                                 static_cast<float*>(partials.tensor.data),
                                                 static_cast<float*>(delta_grad.tensor.data), bf16_data(by_delta),
                                                 nullptr));
    // The same gradients in bf16 (the values are bf16 numbers) through the bf16 entry points.
    const OwnedTensor dq_bf16 = test::make_tensor(*gpu, {encoded}, DType::bf16, dq_values);
    const OwnedTensor dk_bf16 = test::make_tensor(*gpu, {encoded}, DType::bf16, dk_values);
    const OwnedTensor by_encode_bf16 = allocate_tensor(*gpu, {rows, 3 * C}, DType::bf16);
    const OwnedTensor by_delta_bf16 = allocate_tensor(*gpu, {rows, 3 * C}, DType::bf16);
    const OwnedTensor delta_grad_bf16 =
        test::make_tensor(*gpu, {H * d}, DType::f32, std::vector<float>(std::size_t(H) * d, 1.0f));
    test::poison(*gpu, by_encode_bf16.tensor);
    test::poison(*gpu, by_delta_bf16.tensor);
    gpu->synchronize();
    POPE_CUDA_CHECK(kernels::encode_qk_backward(dims, plan, source, bf16_data(dq_bf16), bf16_data(dk_bf16),
                                                bf16_data(by_encode_bf16), nullptr));
    POPE_CUDA_CHECK(kernels::encode_qk_backward(dims, plan, source, bf16_data(dq_bf16), nullptr,
                                                bf16_data(by_delta_bf16), nullptr));
    POPE_CUDA_CHECK(kernels::pope_delta_gradient(dims, plan, source, bf16_data(dk_bf16),
                                                 static_cast<float*>(partials.tensor.data),
                                                 static_cast<float*>(delta_grad_bf16.tensor.data),
                                                 bf16_data(by_delta_bf16), nullptr));
    POPE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<double> from_encode = test::download(*gpu, by_encode.tensor);
    EXPECT_TRUE(same_numbers(from_encode, test::download(*gpu, by_delta.tensor))) << "dq, dk";
    EXPECT_TRUE(same_numbers(from_encode, test::download(*gpu, by_encode_bf16.tensor))) << "dq, dk from bf16";
    EXPECT_TRUE(same_numbers(from_encode, test::download(*gpu, by_delta_bf16.tensor))) << "dq, dk from bf16, δ pass";
    EXPECT_TRUE(same_numbers(test::download(*gpu, delta_grad.tensor), test::download(*gpu, delta_grad_bf16.tensor)))
        << "dδ from bf16";
    std::size_t written = 0;  // the q and k blocks of every row, the v block left alone
    for (double v : from_encode) written += std::isnan(v) ? 0 : 1;
    EXPECT_EQ(written, std::size_t(rows * 2 * C));
    const std::vector<double> q_got = test::download(*gpu, q_encoded.tensor), k_got = test::download(*gpu, k_encoded.tensor);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h)
          for (int c = 0; c < d; ++c) {
            const std::size_t in = std::size_t((std::int64_t(b) * T + t) * 3 * C + h * d + c);
            const std::size_t out = std::size_t(((std::int64_t(b) * H + h) * T + t) * W + c);
            const double angle = (double(offset) + t) * omega[std::size_t(c)];
            const double x_q = qkv_values[in], x_k = qkv_values[in + std::size_t(C)];
            expect_bf16_of(q_got[out], softplus(x_q) * std::cos(angle), "q̃ real", out);
            expect_bf16_of(q_got[out + std::size_t(d)], softplus(x_q) * std::sin(angle), "q̃ imaginary", out);
            const double phi = angle + acting_delta(delta_values[std::size_t(h) * d + c]);
            expect_bf16_of(k_got[out], softplus(x_k) * std::cos(phi), "k̃ real", out);
            expect_bf16_of(k_got[out + std::size_t(d)], softplus(x_k) * std::sin(phi), "k̃ imaginary", out);
            const double g_re = dk_values[out], g_im = dk_values[out + std::size_t(d)];
            expect_bf16_of(from_encode[in + std::size_t(C)],
                           (g_re * std::cos(phi) + g_im * std::sin(phi)) * softplus_derivative(x_k), "dk",
                           in + std::size_t(C));
          }

    const std::vector<double> got = test::download(*gpu, delta_grad.tensor);
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < d; ++c) {
        const float delta_hc = delta_values[std::size_t(h) * d + c];
        const bool passes = !clamp_delta || (delta_hc >= -kTwoPi && delta_hc <= 0.0f);
        double sum = 0.0, magnitude_sum = 0.0;
        for (int b = 0; b < B; ++b)
          for (int t = 0; t < T; ++t) {
            const double x = qkv_values[std::size_t((std::int64_t(b) * T + t) * 3 * C + C + h * d + c)];
            const std::size_t row = std::size_t(((std::int64_t(b) * H + h) * T + t) * W);
            const double g_re = dk_values[row + std::size_t(c)], g_im = dk_values[row + std::size_t(d + c)];
            const double phi = (double(offset) + t) * omega[std::size_t(c)] + acting_delta(delta_hc);
            const double term = softplus(x) * (-g_re * std::sin(phi) + g_im * std::cos(phi));
            sum += term;
            magnitude_sum += std::fabs(term);
          }
        const double want = 1.0 + (passes ? sum : 0.0);
        EXPECT_NEAR(got[std::size_t(h) * d + c], want, 1e-4 * magnitude_sum + 1e-6) << "dδ of head " << h << " channel " << c;
      }
  }
}

}  // namespace
