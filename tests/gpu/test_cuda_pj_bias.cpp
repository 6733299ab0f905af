// The PJ-bias kernels (kernels/attention/pj_bias.*), driven through cuda/learned_bias from a
// composed method as AttentionRunner would, against the CPU encoding: the [H, T] bias table
// and every parameter gradient from random diagonal sums Ĝ, for both ρ, several sector masks
// and orders (each of the kernels' order bounds 4, 8 and 16), and lengths that are not multiples
// of the kernels' 256-lag blocks; the backward must be bitwise reproducible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention/pj_bias.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda/learned_bias.hpp"
#include "position/encodings.hpp"

namespace {

using namespace pope;

// The table is fp64 math stored in f32 on both sides; the gradients are fp64 sums stored in
// f32, in another order than the CPU's.
constexpr double kTableTolerance = 1e-6;
constexpr double kGradientTolerance = 1e-5;

// A device copy of a host f32 vector, freed with the object.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<float>& host) : size_(host.size()) {
    POPE_CUDA_CHECK(cudaMalloc(&data_, size_ * sizeof(float)));
    POPE_CUDA_CHECK(cudaMemcpy(data_, host.data(), size_ * sizeof(float), cudaMemcpyHostToDevice));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }
  float* data() const { return data_; }
  std::vector<float> download() const {
    std::vector<float> host(size_);
    POPE_CUDA_CHECK(cudaMemcpy(host.data(), data_, size_ * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  float* data_ = nullptr;
  std::size_t size_;
};

std::vector<float> random_floats(std::size_t count, std::uint64_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(engine);
  return values;
}

// max |got − want| / max(max |want|, 1e−3) over a buffer.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0.0, scale = 1e-3;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]) / scale);
  return worst;
}

struct Case {
  PjRho rho;
  PjSectorMask sectors;
  int order;
  int seq_len;
};

std::string case_name(const Case& c) {
  return std::string(name_of(c.rho)) + "_K" + std::to_string(c.order) + "_T" + std::to_string(c.seq_len) + "_sectors" +
         std::to_string(int(c.sectors[0])) + std::to_string(int(c.sectors[1])) + std::to_string(int(c.sectors[2]));
}

class CudaPjBias : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaPjBias, TableAndGradientsMatchTheCpuEncoding) {
  const Case& c = GetParam();
  constexpr int kHeads = 3, kTrainLength = 64;
  PjConfig config;
  config.order = c.order;
  config.rho = c.rho;
  // "fj_lc"-like methods: NoPE q/k plus the bias; the bridge must find the bias inside.
  const ComposedEncoding cpu("case", std::make_unique<NopeEncoding>(),
                             std::make_unique<PjBiasEncoding>(config, c.sectors, kTrainLength));
  const auto specs = cpu.layer_parameters(kHeads, 64);

  std::vector<std::vector<float>> params, cpu_grads;
  std::vector<std::unique_ptr<DeviceBuffer>> device_params, device_grads;
  std::vector<float*> device_param_pointers, device_grad_pointers;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    params.push_back(random_floats(static_cast<std::size_t>(shape_numel(specs[i].shape)), 10 + i));
    if (i == kPjOmega)
      for (int h = 0; h < kHeads; ++h) params[i][h] = 0.1f + 0.4f * h;
    cpu_grads.emplace_back(params[i].size(), 0.5f);  // gradients accumulate onto what is there
    device_params.push_back(std::make_unique<DeviceBuffer>(params[i]));
    device_grads.push_back(std::make_unique<DeviceBuffer>(cpu_grads[i]));
    device_param_pointers.push_back(device_params[i]->data());
    device_grad_pointers.push_back(device_grads[i]->data());
  }
  std::vector<const float*> values;
  std::vector<float*> grads;
  for (std::size_t i = 0; i < params.size(); ++i) {
    values.push_back(params[i].data());
    grads.push_back(cpu_grads[i].data());
  }

  // Forward: the [H, T] table.
  const int T = c.seq_len;
  PositionContext ctx;
  ctx.seq_len = T;
  ctx.train_length = kTrainLength;
  ctx.n_head = kHeads;
  ctx.head_dim = 64;
  const auto layer = cuda::LearnedBias::of(cpu.bias_plan(ctx), kHeads, device_param_pointers, device_grad_pointers);
  ASSERT_TRUE(layer.has_value());
  const kernels::PjBiasParams& gpu = layer->pj_params();
  kernels::PjBiasGradients gpu_grads = layer->pj_gradients();
  std::vector<float> want_table(std::size_t(kHeads) * T);
  for (int h = 0; h < kHeads; ++h) cpu.score_bias(ctx, h, values, want_table.data() + std::size_t(h) * T);
  DeviceBuffer table(std::vector<float>(want_table.size(), std::nanf("")));
  POPE_CUDA_CHECK(kernels::pj_bias_table(gpu, T, table.data(), nullptr));
  POPE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(relative_error(table.download(), want_table), kTableTolerance);

  // Backward from random Ĝ (its partial sums' scratch poisoned).
  const std::vector<float> diag = random_floats(std::size_t(kHeads) * T, 99);
  for (int h = 0; h < kHeads; ++h) cpu.score_bias_backward(ctx, h, values, diag.data() + std::size_t(h) * T, grads);
  DeviceBuffer device_diag(diag);
  const std::size_t partial_doubles = kernels::pj_bias_backward_partial_doubles(gpu, T);
  ASSERT_GT(partial_doubles, 0u);
  DeviceBuffer partials(std::vector<float>(2 * partial_doubles, std::nanf("")));
  double* partial_sums = reinterpret_cast<double*>(partials.data());
  POPE_CUDA_CHECK(kernels::pj_bias_backward(gpu, T, device_diag.data(), gpu_grads, partial_sums, nullptr));
  POPE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::vector<float>> first;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    first.push_back(device_grads[i]->download());
    EXPECT_LT(relative_error(first[i], cpu_grads[i]), kGradientTolerance) << specs[i].name;
  }

  // Deterministic: a second run onto fresh buffers gives the same bits.
  std::vector<std::unique_ptr<DeviceBuffer>> again;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<float> reset(params[i].size(), 0.5f);
    again.push_back(std::make_unique<DeviceBuffer>(reset));
    gpu_grads.values[i] = again[i]->data();
  }
  POPE_CUDA_CHECK(kernels::pj_bias_backward(gpu, T, device_diag.data(), gpu_grads, partial_sums, nullptr));
  POPE_CUDA_CHECK(cudaDeviceSynchronize());
  for (std::size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(again[i]->download(), first[i]) << specs[i].name;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaPjBias,
    ::testing::Values(Case{PjRho::linear, {true, true, true}, 3, 1}, Case{PjRho::linear, {true, true, true}, 3, 300},
                      Case{PjRho::lightcone, {true, true, true}, 2, 513}, Case{PjRho::linear, {false, true, false}, 3, 257},
                      Case{PjRho::lightcone, {true, false, true}, 0, 1000}, Case{PjRho::linear, {false, true, true}, 15, 200},
                      Case{PjRho::lightcone, {true, true, true}, 5, 700}),
    [](const auto& info) { return case_name(info.param); });

TEST(CudaLearnedBias, ReadsThePjBiasOfAComposedMethodFromItsPlan) {
  // Host-only: no GPU needed to describe a layer.
  PjConfig config;
  const ComposedEncoding rope_affine("rope_affine", std::make_unique<RopeEncoding>(RopeConfig{}),
                                     std::make_unique<PjBiasEncoding>(config, PjSectorMask{false, true, false}, 32));
  PositionContext ctx;
  ctx.n_head = 2;
  ctx.head_dim = 8;
  std::vector<float> storage(kPjParamCount);
  std::vector<float*> pointers;
  for (float& s : storage) pointers.push_back(&s);
  const auto layer = cuda::LearnedBias::of(rope_affine.bias_plan(ctx), ctx.n_head, pointers);
  ASSERT_TRUE(layer.has_value());
  EXPECT_EQ(layer->pj_params().order, 3);
  EXPECT_EQ(layer->pj_params().train_length, 32);
  EXPECT_FALSE(layer->pj_params().sector_enabled[0]);
  EXPECT_TRUE(layer->pj_params().sector_enabled[1]);
  EXPECT_EQ(layer->pj_params().values[kPjLcIm], &storage[kPjLcIm]);
  EXPECT_EQ(layer->pj_gradients().values[0], nullptr);
  pointers.pop_back();
  EXPECT_THROW(cuda::LearnedBias::of(rope_affine.bias_plan(ctx), ctx.n_head, pointers), std::invalid_argument);
  EXPECT_FALSE(cuda::LearnedBias::of(NopeEncoding{}.bias_plan(ctx), ctx.n_head, {}).has_value());
}

// Host-only: the backward's scratch, per head and 256-lag block, holds the partial sums of ω, the
// FJ damping, the affine slope, three gate logits and 3 per order and oscillating sector, orders
// counted up to the kernels' bound (4, 8 or 16).
TEST(CudaPjBiasArguments, SizesTheBackwardScratchByTheOrderBound) {
  kernels::PjBiasParams p;
  p.n_head = 3;
  p.train_length = 64;
  p.sector_enabled[0] = true;
  const int two_blocks = 300, one_block = 256;
  p.order = 3;
  EXPECT_EQ(kernels::pj_bias_backward_partial_doubles(p, two_blocks), 3u * 2u * (6u + 6u * 4u));
  EXPECT_EQ(kernels::pj_bias_backward_partial_doubles(p, one_block), 3u * 1u * (6u + 6u * 4u));
  p.order = 0;
  EXPECT_EQ(kernels::pj_bias_backward_partial_doubles(p, two_blocks), 3u * 2u * (6u + 6u * 4u));
  p.order = 4;
  EXPECT_EQ(kernels::pj_bias_backward_partial_doubles(p, two_blocks), 3u * 2u * (6u + 6u * 8u));
  p.order = kernels::kPjBiasMaxOrder;
  EXPECT_EQ(kernels::pj_bias_backward_partial_doubles(p, two_blocks), 3u * 2u * (6u + 6u * 16u));
  p.order = kernels::kPjBiasMaxOrder + 1;
  EXPECT_EQ(kernels::pj_bias_backward_partial_doubles(p, two_blocks), 0u);
}

TEST(CudaPjBiasArguments, RejectsInvalidParameters) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  kernels::PjBiasParams p;
  p.n_head = 1;
  p.train_length = 16;
  p.order = kernels::kPjBiasMaxOrder + 1;
  p.sector_enabled[1] = true;
  float* table = nullptr;
  POPE_CUDA_CHECK(cudaMalloc(&table, 16 * sizeof(float)));
  EXPECT_EQ(kernels::pj_bias_table(p, 16, table, nullptr), cudaErrorInvalidValue);
  p.order = 1;
  p.sector_enabled[1] = false;  // no sector
  EXPECT_EQ(kernels::pj_bias_table(p, 16, table, nullptr), cudaErrorInvalidValue);
  p.sector_enabled[1] = true;
  EXPECT_EQ(kernels::pj_bias_backward(p, 16, table, kernels::PjBiasGradients{}, reinterpret_cast<double*>(table),
                                      nullptr),
            cudaErrorInvalidValue);
  kernels::PjBiasGradients gradients;
  for (float*& g : gradients.values) g = table;
  EXPECT_EQ(kernels::pj_bias_backward(p, 16, table, gradients, nullptr, nullptr), cudaErrorInvalidValue)
      << "no scratch for the partial sums";
  EXPECT_EQ(kernels::pj_bias_backward_partial_doubles(p, 0), 0u);
  cudaFree(table);
}

}  // namespace
