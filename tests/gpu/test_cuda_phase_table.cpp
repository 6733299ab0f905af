// The q/k transform's phase tables (kernels::fill_phase_table and fill_key_phase_table, read
// through QkTransformParams::phases and key_phases) against the per-element angles they
// replace: RoPE with every channel and with half of them rotating, PoPE with δ on the keys and
// without δ, at position offsets 0 and 9,000, T not a tile multiple. q̃, k̃, the backward's dq,
// dk and PoPE's dδ must be the same numbers (the tables hold exactly what the kernels computed
// per element), also with PoPE's dk written by δ's gradient pass. Reports SKIPPED without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/qk_transform.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda_op_test_support.hpp"

namespace {

using namespace pope;
using kernels::QkTransformKind;

struct Case {
  const char* name;
  QkTransformKind kind;
  int rotary_pairs;  // rope
  bool delta;        // pope
  int position_offset;
};

struct Outputs {
  std::vector<double> q, k, dqkv, delta_grad;  // delta_grad: PoPE with δ only
};

// Equal element by element, NaN matching NaN (the v block of dqkv stays poisoned).
bool same_numbers(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

TEST(CudaPhaseTable, TabulatedPhasesGiveThePerElementTransformExactly) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_backend("cuda");
  const int B = 2, T = 77, H = 3, d = 64;
  const std::vector<Case> cases{{"rope", QkTransformKind::rope, d / 2, false, 0},
                                {"rope, half the channels", QkTransformKind::rope, d / 4, false, 9000},
                                {"pope with delta", QkTransformKind::pope, 0, true, 9000},
                                {"pope without delta", QkTransformKind::pope, 0, false, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int W = c.kind == QkTransformKind::pope ? 2 * d : d;
    const std::int64_t rows = std::int64_t(B) * T, C = std::int64_t(H) * d, encoded = std::int64_t(B) * H * T * W;
    const OwnedTensor qkv = test::make_tensor(*gpu, {rows, 3 * C}, DType::bf16, test::random_bf16_values(rows * 3 * C, 1));
    const OwnedTensor dq = test::make_tensor(*gpu, {encoded}, DType::f32, test::random_bf16_values(encoded, 2));
    const OwnedTensor dk = test::make_tensor(*gpu, {encoded}, DType::f32, test::random_bf16_values(encoded, 3));
    std::vector<float> delta_values = test::random_bf16_values(std::size_t(H) * d, 4, 3.0f);
    for (float& v : delta_values) v = -std::fabs(v);  // mostly inside [−2π, 0], some past −2π (clamped)
    const OwnedTensor delta = test::make_tensor(*gpu, {H * d}, DType::f32, delta_values);
    const int count = c.kind == QkTransformKind::rope ? c.rotary_pairs : d;
    std::vector<double> omega(static_cast<std::size_t>(count));
    for (int m = 0; m < count; ++m) omega[std::size_t(m)] = std::pow(10000.0, -double(m) / count);
    const OwnedTensor frequencies = allocate_tensor(*gpu, {count}, DType::f64);
    gpu->copy_from_host(frequencies.tensor, omega.data());

    const kernels::AttentionDims dims{.batch = B, .seq_len = T, .n_head = H, .head_dim = d, .qk_width = W};
    kernels::QkTransformParams plan;
    plan.kind = c.kind;
    plan.position_offset = c.position_offset;
    plan.rotary_pairs = c.rotary_pairs;
    plan.frequencies = static_cast<const double*>(frequencies.tensor.data);
    plan.delta = c.delta ? static_cast<const float*>(delta.tensor.data) : nullptr;

    const OwnedTensor table =
        allocate_tensor(*gpu, {std::int64_t(2 * kernels::phase_table_entries(plan, T, d))}, DType::f32);
    gpu->synchronize();  // the kernels below run on the default stream
    // keys_by_delta: dk comes from pope_delta_gradient's pass (as the runner does it), not from
    // encode_qk_backward.
    auto run = [&](const kernels::QkTransformParams& p, bool keys_by_delta = false) {
      const OwnedTensor q_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
      const OwnedTensor k_encoded = allocate_tensor(*gpu, {encoded}, DType::bf16);
      const OwnedTensor dqkv = allocate_tensor(*gpu, {rows, 3 * C}, DType::bf16);
      test::poison(*gpu, dqkv.tensor);
      gpu->synchronize();
      const auto* source = static_cast<const __nv_bfloat16*>(qkv.tensor.data);
      POPE_CUDA_CHECK(kernels::encode_qk(dims, p, source, static_cast<__nv_bfloat16*>(q_encoded.tensor.data),
                                         static_cast<__nv_bfloat16*>(k_encoded.tensor.data), nullptr));
      POPE_CUDA_CHECK(kernels::encode_qk_backward(
          dims, p, source, static_cast<const float*>(dq.tensor.data),
          keys_by_delta ? nullptr : static_cast<const float*>(dk.tensor.data),
          static_cast<__nv_bfloat16*>(dqkv.tensor.data), nullptr));
      Outputs out;
      if (p.delta != nullptr) {
        const OwnedTensor partials = allocate_tensor(
            *gpu, {std::int64_t(kernels::pope_delta_gradient_partial_floats(dims))}, DType::f32);
        const OwnedTensor delta_grad = allocate_tensor(*gpu, {H * d}, DType::f32);  // zero-filled
        gpu->synchronize();
        POPE_CUDA_CHECK(kernels::pope_delta_gradient(dims, p, source, static_cast<const float*>(dk.tensor.data),
                                                     static_cast<float*>(partials.tensor.data),
                                                     static_cast<float*>(delta_grad.tensor.data),
                                                     keys_by_delta ? static_cast<__nv_bfloat16*>(dqkv.tensor.data)
                                                                   : nullptr,
                                                     nullptr));
        POPE_CUDA_CHECK(cudaDeviceSynchronize());
        out.delta_grad = test::download(*gpu, delta_grad.tensor);
      }
      POPE_CUDA_CHECK(cudaDeviceSynchronize());
      out.q = test::download(*gpu, q_encoded.tensor);
      out.k = test::download(*gpu, k_encoded.tensor);
      out.dqkv = test::download(*gpu, dqkv.tensor);
      return out;
    };
    const Outputs per_element = run(plan);
    kernels::QkTransformParams tabulated = plan;
    auto* entries = static_cast<float2*>(table.tensor.data);
    POPE_CUDA_CHECK(kernels::fill_phase_table(plan, T, d, entries, nullptr));
    tabulated.phases = entries;
    const std::size_t key_entries = kernels::key_phase_table_entries(plan, H, T, d);
    EXPECT_EQ(key_entries, c.delta ? std::size_t(H) * T * d : 0u);
    const OwnedTensor key_table = allocate_tensor(*gpu, {std::int64_t(2 * key_entries + 2)}, DType::f32);
    auto* key_phases = static_cast<float2*>(key_table.tensor.data);
    gpu->synchronize();
    if (key_entries > 0) {
      POPE_CUDA_CHECK(kernels::fill_key_phase_table(plan, H, T, d, key_phases, nullptr));
      tabulated.key_phases = key_phases;
    }
    const Outputs from_table = run(tabulated);
    EXPECT_TRUE(same_numbers(per_element.q, from_table.q)) << "q̃";
    EXPECT_TRUE(same_numbers(per_element.k, from_table.k)) << "k̃";
    EXPECT_TRUE(same_numbers(per_element.dqkv, from_table.dqkv)) << "dq, dk";
    EXPECT_TRUE(same_numbers(per_element.delta_grad, from_table.delta_grad)) << "dδ";
    if (c.delta) {  // the keys' dk written by δ's pass instead: the same numbers, and dδ unchanged
      const Outputs keys_by_delta = run(tabulated, true);
      EXPECT_TRUE(same_numbers(per_element.dqkv, keys_by_delta.dqkv)) << "dq, dk with dk from δ's pass";
      EXPECT_TRUE(same_numbers(per_element.delta_grad, keys_by_delta.delta_grad)) << "dδ with dk written";
    }
    if (key_entries > 0) {  // the kernels do read the key table: zeroed entries change k̃ and dδ
      POPE_CUDA_CHECK(cudaMemset(key_phases, 0, key_entries * sizeof(float2)));
      const Outputs zeroed_keys = run(tabulated);
      EXPECT_FALSE(same_numbers(per_element.k, zeroed_keys.k)) << "k̃ did not change with a zeroed key table";
      EXPECT_FALSE(same_numbers(per_element.delta_grad, zeroed_keys.delta_grad)) << "dδ did not change";
    }
    EXPECT_EQ(kernels::phase_table_entries(plan, T, d), std::size_t(T) * std::size_t(count));
    // The kernels do read the table: zeroed entries (cos = sin = 0) change q̃.
    POPE_CUDA_CHECK(cudaMemset(entries, 0, kernels::phase_table_entries(plan, T, d) * sizeof(float2)));
    EXPECT_FALSE(same_numbers(per_element.q, run(tabulated).q)) << "q̃ did not change with a zeroed table";
  }
}

}  // namespace
