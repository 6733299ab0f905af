// Incremental decoding on the GPU (CudaBackend::attention_decode) for every encoding of the
// registry: each step's logits against the GPU's own full forward over the same tokens and
// against the CPU's decode, within bf16 tolerance, past the training length too; greedy
// decoding repeats bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "cuda/cuda_device.hpp"
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
ModelConfig decode_model(const std::string& kind) {
  ModelConfig c = pope::testing::model_config(
      {.vocab_size = 500, .padded_vocab_size = 512, .n_layer = 2, .n_head = 4, .n_embd = 256, .context_length = 64},
      kind);
  c.position.pope.delta_init = DeltaInit::uniform;
  return c;
}

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

}  // namespace

TEST_P(CudaDecode, StepsMatchTheFullForwardAndTheCpu) {
  const ModelConfig config = decode_model(GetParam());
  const bool within_training_length_only = !make_position_encoding(config)->extrapolates();
  const int total = within_training_length_only ? 64 : 100;
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
  for (int n : {40, 1, 1, 7, 1, total - 50}) {
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
    EXPECT_LT(relative_error(got, full), 2e-2) << GetParam() << ": GPU decode vs GPU forward, positions " << done;
    EXPECT_LT(relative_error(got, cpu_got), 2e-2) << GetParam() << ": GPU decode vs CPU decode, positions " << done;
  }
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
// log-probabilities agree with the host's log-softmax within fp32 rounding.
TEST_P(CudaDecode, GreedyOnTheGpuEqualsTheHostArgmax) {
  const ModelConfig config = decode_model(GetParam());
  auto gpu = make_backend(DeviceChoice::cuda);
  Model model(config, *gpu);
  model.initialize(41);
  model.parameters_from_host(perturbed_weights(model, 43));
  const int prompt = 7, steps = 25;
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

// Dynamic NTK encodes the cached keys again at every length, which only the CPU decode does.
TEST(CudaDecodeRefusals, DynamicNtkIsRefusedNamingTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  ModelConfig config = decode_model("rope");
  config.position.rope.scaling.kind = RopeScalingKind::dynamic_ntk;
  auto gpu = make_backend(DeviceChoice::cuda);
  Model model(config, *gpu);
  model.initialize(1);
  auto cache = model.make_kv_cache(1, 8);
  try {
    model.decode(*cache, std::vector<std::int32_t>{1, 2}, 2);
    FAIL() << "the GPU decoded dynamic NTK";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, CudaDecode, ::testing::ValuesIn(position_kinds()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });
