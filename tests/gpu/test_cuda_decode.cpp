// Incremental decoding on the GPU (CudaBackend::attention_decode) for every encoding of the
// registry and RoPE with dynamic NTK (its cached keys encoded again at every length, its steps
// never recorded; one layer, see decode_case_config): each step's logits against the GPU's own
// full forward over the same tokens and against the CPU's decode, within bf16 tolerance, past the
// training length too, also from a prompt longer than it; greedy decoding repeats bit for bit.
// Dynamic NTK's cache and outputs against the CPU's at the op (Backend::attention_decode), element
// by element, at every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_device.hpp"
#include "cuda_op_test_support.hpp"
#include "pope/model.hpp"
#include "pope/rng.hpp"
#include "pope/sample.hpp"
#include "position/registry.hpp"
#include "unit/model_shape.hpp"

using namespace pope;

namespace {

constexpr int kBatch = 2;

class CudaDecode : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

// Head dim 64 as in the paper models; trained at 64 positions, decoded up to 100.
ModelConfig decode_model(const std::string& name) {
  ModelConfig c = pope::testing::decode_case_config(
      {.vocab_size = 500, .padded_vocab_size = 512, .n_layer = 2, .n_head = 4, .n_embd = 256, .context_length = 64},
      name);
  c.position.pope.delta_init = DeltaInit::uniform;
  return c;
}

bool extrapolates(const ModelConfig& config) { return make_position_encoding(config)->extrapolates(); }

std::vector<float> perturbed_weights(const Model& model, std::uint64_t seed) {
  std::vector<float> values = model.parameters_to_host();
  Rng rng(seed);
  for (float& v : values) v += float(0.02 * rng.normal());
  return values;
}

// max |a − b| / max |b|.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0.0, error = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    scale = std::max(scale, double(std::abs(b[i])));
    error = std::max(error, double(std::abs(a[i] - b[i])));
  }
  return error / std::max(scale, 1e-30);
}

std::vector<std::int32_t> prefix(const std::vector<std::int32_t>& tokens, int total, int length) {
  std::vector<std::int32_t> out;
  for (int b = 0; b < kBatch; ++b) out.insert(out.end(), tokens.begin() + b * total, tokens.begin() + b * total + length);
  return out;
}

// Decodes `total` positions of kBatch random sequences in the pieces `steps` (their sum), each
// piece's logits against the GPU's full forward over the tokens up to it and the CPU's decode.
void expect_steps_match_the_full_forward_and_the_cpu(const std::string& name, int total,
                                                     const std::vector<int>& steps) {
  const ModelConfig config = decode_model(name);
  auto gpu = make_backend(DeviceChoice::cuda);
  auto cpu = make_backend(DeviceChoice::cpu, "float", 0);
  Model gpu_model(config, *gpu), cpu_model(config, *cpu);
  cpu_model.initialize(11);
  const std::vector<float> weights = perturbed_weights(cpu_model, 13);
  cpu_model.parameters_from_host(weights);
  gpu_model.parameters_from_host(weights);
  Rng rng(17);
  std::vector<std::int32_t> tokens(std::size_t(kBatch) * total);
  for (auto& t : tokens) t = std::int32_t(rng.below(std::uint64_t(config.vocab_size)));

  auto gpu_cache = gpu_model.make_kv_cache(kBatch, total);
  auto cpu_cache = cpu_model.make_kv_cache(kBatch, total);
  const std::size_t V = std::size_t(config.vocab_size);
  int done = 0;
  for (int n : steps) {
    std::vector<std::int32_t> step;
    for (int b = 0; b < kBatch; ++b)
      step.insert(step.end(), tokens.begin() + b * total + done, tokens.begin() + b * total + done + n);
    const std::vector<float> got = gpu_model.decode(*gpu_cache, step, n);
    const std::vector<float> cpu_got = cpu_model.decode(*cpu_cache, step, n);
    done += n;
    std::vector<std::int64_t> rows;
    for (int b = 0; b < kBatch; ++b) rows.push_back(std::int64_t(b) * done + done - 1);
    const std::vector<float> full = gpu_model.logits_at(prefix(tokens, total, done).data(), kBatch, done, rows);
    ASSERT_EQ(got.size(), kBatch * V);
    EXPECT_LT(relative_error(got, full), 2e-2) << name << ": GPU decode vs GPU forward, positions " << done;
    EXPECT_LT(relative_error(got, cpu_got), 2e-2) << name << ": GPU decode vs CPU decode, positions " << done;
  }
}

}  // namespace

TEST_P(CudaDecode, StepsMatchTheFullForwardAndTheCpu) {
  const int total = extrapolates(decode_model(GetParam())) ? 100 : 64;
  expect_steps_match_the_full_forward_and_the_cpu(GetParam(), total, {40, 1, 1, 7, 1, total - 50});
}

// A prompt of 80 positions, past the training length 64 (where dynamic NTK's frequencies start to
// change with every step), then one-token steps there.
TEST_P(CudaDecode, PromptPastTheTrainingLengthThenSteps) {
  if (!extrapolates(decode_model(GetParam()))) GTEST_SKIP() << GetParam() << " is defined up to its training length";
  expect_steps_match_the_full_forward_and_the_cpu(GetParam(), 100, {80, 1, 1, 1, 17});
}

TEST_P(CudaDecode, GreedyDecodingRepeatsBitwise) {
  const ModelConfig config = decode_model(GetParam());
  auto gpu = make_backend(DeviceChoice::cuda);
  Model model(config, *gpu);
  model.initialize(21);
  const std::vector<std::int32_t> prompt{1, 2, 3, 4, 5, 6, 7};
  auto run = [&] {
    std::vector<std::int32_t> out;
    generate(model, prompt, 2, 20, SamplingOptions{.temperature = 0.0}, 0, [&](int, const GeneratedToken& t) {
      out.push_back(t.id);
      return true;
    });
    return out;
  };
  const std::vector<std::int32_t> first = run();
  EXPECT_EQ(first.size(), 40u);
  EXPECT_EQ(run(), first);
}

// Greedy choices made on the GPU, each step queued one ahead of the host (Model::queue_greedy),
// give the tokens that the host's argmax of the same model's decode() logits gives; their
// log-probabilities agree with the host's log-softmax within fp32 rounding. The steps run past
// the training length for the encodings defined there.
TEST_P(CudaDecode, GreedyOnTheGpuEqualsTheHostArgmax) {
  const ModelConfig config = decode_model(GetParam());
  auto gpu = make_backend(DeviceChoice::cuda);
  Model model(config, *gpu);
  model.initialize(41);
  model.parameters_from_host(perturbed_weights(model, 43));
  const int prompt = extrapolates(config) ? 70 : 7, steps = 25;  // past the training length where defined
  std::vector<std::int32_t> input(std::size_t(kBatch) * prompt);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = std::int32_t(3 + 7 * i % 400);

  auto host_cache = model.make_kv_cache(kBatch, prompt + steps);
  std::vector<float> logits = model.decode(*host_cache, input, prompt);
  auto cache = model.make_kv_cache(kBatch, prompt + steps);
  model.queue_greedy(*cache, input, prompt);
  const std::size_t V = std::size_t(config.vocab_size);
  for (int s = 0; s < steps; ++s) {
    std::vector<std::int32_t> want(kBatch);
    std::vector<double> want_log_probs(kBatch);
    for (std::size_t b = 0; b < std::size_t(kBatch); ++b) {
      const std::span<const float> row(logits.data() + b * V, V);
      want[b] = std::int32_t(std::max_element(row.begin(), row.end()) - row.begin());
      want_log_probs[b] = token_log_probability(row, want[b]);
    }
    model.queue_greedy(*cache);
    const Model::GreedyChoice got = model.read_greedy(*cache);
    ASSERT_EQ(got.ids, want) << GetParam() << " step " << s;
    for (std::size_t b = 0; b < std::size_t(kBatch); ++b)
      EXPECT_NEAR(got.log_probs[b], want_log_probs[b], 1e-4) << GetParam() << " step " << s;
    logits = model.decode(*host_cache, want, 1);
  }
  model.read_greedy(*cache);
}

// Recorded one-token steps (a CUDA graph replayed at each position) give the eager steps' logits
// bit for bit, also when the scratch they hold changes between steps (recorded again).
TEST_P(CudaDecode, RecordedStepsEqualEagerStepsBitwise) {
  const ModelConfig config = decode_model(GetParam());
  auto gpu = make_backend(DeviceChoice::cuda);
  Model model(config, *gpu);
  model.initialize(31);
  model.parameters_from_host(perturbed_weights(model, 37));
  const int prompt = 9, steps = 30;
  auto run = [&](bool record, bool disturb) {
    auto cache = model.make_kv_cache(kBatch, prompt + steps);
    cache->set_record_steps(record);
    std::vector<std::int32_t> input(std::size_t(kBatch) * prompt);
    for (std::size_t i = 0; i < input.size(); ++i) input[i] = std::int32_t(1 + i % 50);
    std::vector<float> all = model.decode(*cache, input, prompt);
    for (int s = 0; s < steps; ++s) {
      if (disturb && s == steps / 2) {  // another cache's longer prefill grows the attention's scratch
        auto other = model.make_kv_cache(kBatch, 60);
        model.decode(*other, std::vector<std::int32_t>(std::size_t(kBatch) * 60, 3), 60);
      }
      const std::vector<std::int32_t> next{std::int32_t(2 + s % 7), std::int32_t(5 + s % 11)};
      const std::vector<float> logits = model.decode(*cache, next, 1);
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  };
  const std::vector<float> eager = run(false, false);
  EXPECT_EQ(run(true, false), eager) << GetParam();
  EXPECT_EQ(run(true, true), eager) << GetParam();
}

// Dynamic NTK at the op: a prompt of 70 positions, past the training length 64, then one-token
// steps to 100, the GPU against the CPU on the same bf16 numbers: raw keys and values exactly,
// every cached key within bf16 rounding of the CPU's (encoded again at each length; one left at an
// earlier length's frequencies is off by far more), the outputs within bf16 tolerance.
TEST(CudaDecodeDynamicNtk, CacheAndOutputsMatchTheCpuAtEveryStep) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  const ModelConfig config = decode_model(pope::testing::kDynamicNtkCase);
  const std::unique_ptr<PositionEncoding> encoding = make_position_encoding(config);
  const int B = kBatch, H = config.n_head, d = config.head_dim(), L = config.context_length, capacity = 100;
  const std::int64_t C = std::int64_t(H) * d;
  auto gpu = make_backend(DeviceChoice::cuda);
  auto cpu = make_backend(DeviceChoice::cpu, "float", 0);
  struct Side {
    Backend& backend;
    DType dtype;
    OwnedTensor keys, values, raw_keys;
  };
  std::vector<Side> sides;
  for (Backend* backend : {gpu.get(), cpu.get()}) {
    const DType dtype = backend == gpu.get() ? DType::bf16 : DType::f32;
    auto cache = [&] { return allocate_tensor(*backend, {B, H, capacity, d}, dtype); };
    sides.push_back(Side{*backend, dtype, cache(), cache(), cache()});
  }
  const int prompt = 70;
  std::vector<double> prompt_keys, last_keys;  // the CPU's keys after the prompt's call and after the last
  int p0 = 0;
  std::uint64_t seed = 51;
  for (int n : {prompt, 1, 1, 1, capacity - prompt - 3}) {
    SCOPED_TRACE("positions " + std::to_string(p0) + " + " + std::to_string(n));
    const std::vector<float> qkv_values = test::random_bf16_values(std::size_t(B) * n * 3 * C, seed++);
    std::vector<std::vector<double>> outs, keys, values, raw_keys;
    for (Side& side : sides) {
      const OwnedTensor qkv = test::make_tensor(side.backend, {std::int64_t(B) * n, 3 * C}, side.dtype, qkv_values);
      const OwnedTensor out = allocate_tensor(side.backend, {std::int64_t(B) * n, C}, side.dtype);
      const OwnedTensor past = test::make_ids(side.backend, {p0});
      side.backend.attention_decode(AttentionDecode{AttentionShape{B, n, H, d}, encoding.get(),
                                                    PositionContext{n, L, H, d, p0}, past.tensor, qkv.tensor,
                                                    out.tensor, {}, KvCacheLayer{side.keys.tensor, side.values.tensor,
                                                                                 side.raw_keys.tensor}});
      outs.push_back(test::download(side.backend, out.tensor));
      keys.push_back(test::download(side.backend, side.keys.tensor));
      values.push_back(test::download(side.backend, side.values.tensor));
      raw_keys.push_back(test::download(side.backend, side.raw_keys.tensor));
    }
    EXPECT_TRUE(raw_keys[0] == raw_keys[1]) << "raw keys";
    EXPECT_TRUE(values[0] == values[1]) << "values";
    std::size_t off = 0;
    for (std::size_t i = 0; i < keys[1].size(); ++i)
      off += !(std::abs(keys[0][i] - keys[1][i]) <= std::ldexp(std::abs(keys[1][i]), -8) + 1e-5);
    EXPECT_EQ(off, 0u) << "cached keys beyond bf16 rounding of the CPU's";
    EXPECT_LT(test::relative_error(outs[0], outs[1]), 1e-2);
    if (p0 == 0) prompt_keys = keys[1];
    last_keys = keys[1];
    p0 += n;
  }
  // The test's power: the prompt's keys moved with the length by far more than the tolerance.
  double moved = 0.0;
  for (std::size_t i = 0; i < prompt_keys.size(); ++i)
    if (int(i / std::size_t(d)) % capacity < prompt) moved = std::max(moved, std::abs(last_keys[i] - prompt_keys[i]));
  EXPECT_GT(moved, 0.1);
}

INSTANTIATE_TEST_SUITE_P(Registry, CudaDecode, ::testing::ValuesIn(pope::testing::decode_cases()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });
