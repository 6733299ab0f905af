// The zero-shot tasks on the GPU: for every task's rule on the hand-written files of
// tests/data/zero_shot, a tiny model's log-likelihoods on the CUDA backend (bf16 activations,
// fp32 logits) equal the CPU's within bf16 tolerance, the decisions agree wherever the CPU's
// margin exceeds that tolerance, and the GPU's scores do not depend on the batching.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/cuda_device.hpp"
#include "pope/model.hpp"
#include "pope/rng.hpp"
#include "pope/zero_shot.hpp"
#include "unit/model_shape.hpp"

using namespace pope;

namespace {

const std::filesystem::path kFixtures = std::filesystem::path(POPE_SOURCE_DIR) / "tests/data/zero_shot";

// Per request: |LL_gpu − LL_cpu| ≤ kAbsolute + kPerToken · tokens (bf16 activations).
constexpr double kAbsolute = 0.05, kPerToken = 0.02;

std::vector<std::int32_t> byte_tokens(std::string_view text) {
  return std::vector<std::int32_t>(text.begin(), text.end());
}

class CudaZeroShot : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

// Head dim 64 as in the paper models, a byte vocabulary; trained at 128 positions (CBT's
// examples run past it: PoPE extrapolates).
ModelConfig zero_shot_model() {
  return pope::testing::model_config(
      {.vocab_size = 128, .padded_vocab_size = 128, .n_layer = 2, .n_head = 4, .n_embd = 256, .context_length = 128},
      "pope");
}

ZeroShotOptions options(std::int64_t budget) {
  ZeroShotOptions o;
  o.max_batch_tokens = budget;
  o.end_of_text = 0;
  return o;
}

double tolerance(int tokens) { return kAbsolute + kPerToken * tokens; }

}  // namespace

TEST_P(CudaZeroShot, ScoresMatchTheCpuAndTheBatching) {
  const std::string name = GetParam();
  const auto entries = find_suite_files(kFixtures);
  const auto entry = std::find_if(entries.begin(), entries.end(), [&](const SuiteEntry& e) { return e.name == name; });
  ASSERT_NE(entry, entries.end()) << name;
  const TaskData data = read_task(entry->task, entry->path);

  auto gpu = make_backend(DeviceChoice::cuda);
  auto cpu = make_backend(DeviceChoice::cpu, "float", 0);
  Model gpu_model(zero_shot_model(), *gpu), cpu_model(zero_shot_model(), *cpu);
  cpu_model.initialize(11);
  std::vector<float> weights = cpu_model.parameters_to_host();
  Rng rng(13);
  for (float& v : weights) v += float(0.02 * rng.normal());
  cpu_model.parameters_from_host(weights);
  gpu_model.parameters_from_host(weights);

  const TaskResult on_cpu = evaluate_task(cpu_model, data, byte_tokens, options(32768));
  const TaskResult on_gpu = evaluate_task(gpu_model, data, byte_tokens, options(32768));
  const TaskResult gpu_one_per_forward = evaluate_task(gpu_model, data, byte_tokens, options(1));
  ASSERT_EQ(on_gpu.examples.size(), on_cpu.examples.size());
  for (std::size_t e = 0; e < on_cpu.examples.size(); ++e) {
    const ExampleResult &c = on_cpu.examples[e], &g = on_gpu.examples[e];
    std::vector<double> ll;
    double worst_tolerance = 0.0;
    for (std::size_t k = 0; k < c.choices.size(); ++k) {
      const double tol = tolerance(c.choices[k].tokens);
      EXPECT_NEAR(g.choices[k].log_likelihood, c.choices[k].log_likelihood, tol) << name << " " << e << "/" << k;
      EXPECT_NEAR(gpu_one_per_forward.examples[e].choices[k].log_likelihood, g.choices[k].log_likelihood, tol / 4)
          << name << " " << e << "/" << k << ": batching";
      ll.push_back(c.choices[k].log_likelihood);
      worst_tolerance = std::max(worst_tolerance, tol);
    }
    std::sort(ll.rbegin(), ll.rend());
    if (ll.size() > 1 && ll[0] - ll[1] > 2 * worst_tolerance) {
      EXPECT_EQ(g.chosen, c.chosen) << name << " " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryTask, CudaZeroShot,
                         ::testing::Values("lambada", "hellaswag", "piqa", "arc_easy", "blimp", "cbt_cn", "cbt_ne"));
