// ZeRO-1 on the CPU: ranks are threads (ThreadCommunicator), the model in double. Sharding
// the AdamW state over 2 or 3 ranks gives the weights of the unsharded optimizer, shard
// edges cutting tensors with and without weight decay, the arena padded to the ranks; the
// moments gathered for a checkpoint are the whole arena's, and a sharded run resumed from them
// continues as the unsharded one does; PoPE's δ projected into [−2π, 0] (delta_bound project)
// by its shard's owner reaches every rank bit for bit; with FP8 products (Model::set_fp8), sharded
// steps give the unsharded data-parallel weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <numbers>
#include <string>
#include <thread>
#include <vector>

#include "pope/rng.hpp"
#include "pope/train_step.hpp"
#include "thread_communicator.hpp"
#include "model_shape.hpp"
#include "vector_compare.hpp"

using namespace pope;

namespace {

// Every tensor's size is a multiple of n_embd: 25 makes an arena that does not split evenly
// over 3 ranks, so that the padding is exercised (PoPE takes odd head widths).
ModelConfig tiny_model(DeltaBound bound = DeltaBound::clamp) {
  ModelConfig config = pope::testing::model_config({.n_head = 5, .n_embd = 25}, "pope");
  config.position.pope.delta_bound = bound;
  return config;
}

OptimConfig optim_config() {
  OptimConfig c;
  c.weight_decay = 0.1;
  c.grad_clip = 0.05;  // small: the global norm (summed over shards) decides every step's clipping
  return c;
}

constexpr int kB = 2, kT = 8, kSteps = 4;

std::vector<std::int32_t> random_tokens(std::size_t count, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> tokens(count);
  for (auto& t : tokens) t = std::int32_t(rng.below(64));
  return tokens;
}

// Global micro-batch m of step s (the same on any number of ranks).
std::vector<std::int32_t> micro_batch(long s, int m, std::uint64_t stream) {
  return random_tokens(kB * kT, std::uint64_t(1000 * s + 10 * m) + stream);
}

struct RankResult {
  std::vector<float> weights, m, v;
  std::size_t state_bytes = 0;
};

// kSteps steps of a global batch of 6 micro-batches on `ranks` thread ranks (6 / ranks each),
// sharded or not; then, when `resume_steps` > 0, every rank reloads the gathered moments into
// a fresh optimizer and model and runs that many more steps.
// fp8_history > 0: the blocks' products in FP8 with that amax history (train.precision = "fp8").
std::vector<RankResult> train(int ranks, bool sharded, int resume_steps = 0, DeltaBound bound = DeltaBound::clamp,
                              int fp8_history = 0) {
  const int per_rank = 6 / ranks;
  auto world = std::make_shared<pope::testing::ThreadWorld>(ranks);
  std::vector<RankResult> results(static_cast<std::size_t>(ranks));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      pope::testing::ThreadCommunicator communicator(world, r);
      try {
        auto backend = make_backend(DeviceChoice::cpu, "double", 1);
        const auto run = [&](Model& model, AdamW& adamw, long first, long last) {
          TrainStep step(model, adamw, TrainStepShape{per_rank, kB, kT, 1.0 / (6 * kB * kT)}, true, &communicator);
          for (long s = first; s <= last; ++s) {
            std::vector<std::int32_t> tokens, targets;
            for (int m = r * per_rank; m < (r + 1) * per_rank; ++m) {
              const auto t = micro_batch(s, m, 1), y = micro_batch(s, m, 2);
              tokens.insert(tokens.end(), t.begin(), t.end());
              targets.insert(targets.end(), y.begin(), y.end());
            }
            step.enqueue(tokens, targets, s, 3e-3);
            EXPECT_TRUE(step.result(s).optimizer.applied);
          }
        };
        Model model(tiny_model(bound), *backend, sharded ? ranks : 1);
        model.initialize(7);
        if (fp8_history > 0) model.set_fp8(fp8_history);
        AdamW adamw(model, optim_config(), sharded ? &communicator : nullptr);
        run(model, adamw, 1, kSteps);
        RankResult& result = results[std::size_t(r)];
        result.state_bytes = adamw.state_bytes();
        result.m = adamw.first_moment_to_host();
        result.v = adamw.second_moment_to_host();
        if (resume_steps > 0) {
          Model resumed(tiny_model(bound), *backend, sharded ? ranks : 1);
          resumed.parameters_from_host(model.parameters_to_host());
          AdamW resumed_adamw(resumed, optim_config(), sharded ? &communicator : nullptr);
          resumed_adamw.moments_from_host(result.m, result.v);
          run(resumed, resumed_adamw, kSteps + 1, kSteps + resume_steps);
          result.weights = resumed.parameters_to_host();
        } else {
          result.weights = model.parameters_to_host();
        }
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
        communicator.abort();  // the other ranks must not wait for this one
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

// Relative to the largest magnitude: the sharded norm sums the squares in another order,
// so clipping factors (and everything after) may differ in the last bits of a double.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0.0, worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(double(a[i])));
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  }
  EXPECT_LE(worst, 1e-6 * scale) << what;  // float round trip of double values
}

}  // namespace

class ZeroOptimizer : public ::testing::TestWithParam<int> {};

TEST_P(ZeroOptimizer, ShardedStepsGiveTheUnshardedWeightsAndMoments) {
  const int ranks = GetParam();
  const auto reference = train(1, false);
  const auto sharded = train(ranks, true);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(sharded[std::size_t(r)].weights, sharded[0].weights) << "rank " << r << " holds other weights";
    expect_close(reference[0].weights, sharded[std::size_t(r)].weights, "weights");
    expect_close(reference[0].m, sharded[std::size_t(r)].m, "first moments gathered");
    expect_close(reference[0].v, sharded[std::size_t(r)].v, "second moments gathered");
  }
  // The weights moved (the comparison is not of two untouched initialisations).
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  Model fresh(tiny_model(), *backend);
  fresh.initialize(7);
  EXPECT_GT(std::abs(fresh.parameters_to_host()[5] - reference[0].weights[5]), 1e-5);
  // Each rank holds 1/ranks of the (padded) state.
  const std::size_t arena = reference[0].m.size();
  // Parameters start at aligned offsets, so the arena always splits over two ranks; three
  // need the padding.
  if (ranks == 3) {
    EXPECT_NE(arena % 3, 0u) << "the test means to cover the padding";
  }
  EXPECT_EQ(sharded[0].state_bytes, 2 * sizeof(double) * ((arena + std::size_t(ranks) - 1) / std::size_t(ranks)));
  EXPECT_EQ(reference[0].state_bytes, 2 * sizeof(double) * arena);
}

TEST_P(ZeroOptimizer, AShardedRunResumedFromGatheredMomentsContinuesLikeTheUnshardedOne) {
  const int ranks = GetParam();
  const auto reference = train(1, false, 2);
  const auto sharded = train(ranks, true, 2);
  expect_close(reference[0].weights, sharded[0].weights, "weights after the resumed steps");
}

// δ starts at 0 and every step pushes some entries up: projected, no entry ends above 0 and some
// sit on 0 exactly; under delta_bound none some end above it (the projection is what holds them).
TEST_P(ZeroOptimizer, ProjectedDeltaIsTheSameOnEveryRankAndStaysInItsBounds) {
  const int ranks = GetParam();
  const auto reference = train(1, false, 0, DeltaBound::project);
  const auto sharded = train(ranks, true, 0, DeltaBound::project);
  const auto unbounded = train(1, false, 0, DeltaBound::none);
  const ModelConfig config = tiny_model(DeltaBound::project);
  const ParameterLayout layout = build_parameter_layout(config, *make_position_encoding(config));
  const auto deltas = [&](const std::vector<float>& weights) {
    std::vector<float> values;
    for (int l = 0; l < config.n_layer; ++l) {
      const std::size_t index = layout.index_of("layers." + std::to_string(l) + ".position.delta");
      const auto first = weights.begin() + layout.offset(index);
      values.insert(values.end(), first, first + shape_numel(layout.specs()[index].shape));
    }
    return values;
  };
  for (int r = 0; r < ranks; ++r)
    EXPECT_EQ(sharded[std::size_t(r)].weights, sharded[0].weights) << "rank " << r << " holds other weights";
  expect_close(reference[0].weights, sharded[0].weights, "weights");
  const std::vector<float> projected = deltas(sharded[0].weights), free = deltas(unbounded[0].weights);
  const float lowest = float(-2.0 * std::numbers::pi);
  EXPECT_TRUE(std::all_of(projected.begin(), projected.end(), [&](float d) { return d >= lowest && d <= 0.0f; }));
  EXPECT_TRUE(std::any_of(projected.begin(), projected.end(), [](float d) { return d == 0.0f; }));
  EXPECT_TRUE(std::any_of(projected.begin(), projected.end(), [](float d) { return d < 0.0f; }));
  EXPECT_TRUE(std::any_of(free.begin(), free.end(), [](float d) { return d > 0.0f; }));
}

// Each rank casts its own micro-batches, so its activation and gradient scales follow its own amax
// history: the FP8 rounding depends on how the batch is split, not on the optimizer's sharding.
// Sharded FP8 steps give the weights of unsharded data-parallel FP8 steps on as many ranks, every
// rank the same ones, and their update keeps the direction of the exact (non-FP8) update within
// FP8's error (cosine ≈ 0.984 here for one rank, 3 mantissa bits in a 25-wide model).
TEST_P(ZeroOptimizer, FP8ShardedStepsGiveTheUnshardedFP8Weights) {
  const int ranks = GetParam();
  const auto unsharded = train(ranks, false, 0, DeltaBound::clamp, 16);
  const auto sharded = train(ranks, true, 0, DeltaBound::clamp, 16);
  for (int r = 0; r < ranks; ++r)
    EXPECT_EQ(sharded[std::size_t(r)].weights, sharded[0].weights) << "rank " << r << " holds other weights";
  expect_close(unsharded[0].weights, sharded[0].weights, "weights");
  const auto exact = train(1, false);
  EXPECT_NE(sharded[0].weights, exact[0].weights) << "the products did not run in FP8";
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  Model fresh(tiny_model(), *backend);
  fresh.initialize(7);
  const std::vector<float> start = fresh.parameters_to_host();
  std::vector<double> update(start.size()), exact_update(start.size());
  for (std::size_t i = 0; i < start.size(); ++i) {
    update[i] = double(sharded[0].weights[i]) - start[i];
    exact_update[i] = double(exact[0].weights[i]) - start[i];
  }
  EXPECT_GT(pope::testing::cosine(update, exact_update), 0.95);
  EXPECT_NEAR(pope::testing::norm_ratio(update, exact_update), 1.0, 0.05);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroOptimizer, ::testing::Values(2, 3));

TEST(ZeroOptimizerSetup, AnArenaNotPaddedToTheRanksIsRefused) {
  auto world = std::make_shared<pope::testing::ThreadWorld>(3);
  pope::testing::ThreadCommunicator communicator(world, 0);
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  Model model(tiny_model(), *backend);  // arena_multiple 1
  ASSERT_NE(model.parameters().numel() % 3, 0);
  EXPECT_THROW(AdamW(model, optim_config(), &communicator), std::invalid_argument);
}
