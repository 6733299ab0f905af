// TrainStep on the CPU: the same parameters, moments, loss and norm, bit for bit, as the
// per-step path it replaces (host forward_backward per micro-batch, then AdamW::step); a
// non-finite step skipped on the device and reported; bad inputs and stale reads refused;
// phase timing that changes no result.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "pope/rng.hpp"
#include "pope/train_step.hpp"
#include "model_shape.hpp"

using namespace pope;

namespace {

ModelConfig tiny_model() {
  ModelConfig c = pope::testing::model_config(pope::testing::kTinyShape, "pope");
  c.position.pope.delta_init = DeltaInit::uniform;  // δ takes part in the update too
  return c;
}

OptimConfig clipping_optimizer() {
  OptimConfig oc;
  oc.weight_decay = 0.1;
  oc.grad_clip = 0.05;  // small enough to clip on some steps, not necessarily all
  return oc;
}

constexpr TrainStepShape kShape{2, 3, 5, 1.0 / 30.0};  // 2 micro-batches of 3 × 5 tokens

// Random tokens and targets for one step, with a few masked targets.
struct StepBatch {
  std::vector<std::int32_t> tokens, targets;
  StepBatch(Rng& rng, int vocab) {
    for (std::int64_t i = 0; i < kShape.tokens(); ++i) {
      tokens.push_back(std::int32_t(rng.below(std::uint64_t(vocab))));
      targets.push_back(i % 7 == 3 ? -1 : std::int32_t(rng.below(std::uint64_t(vocab))));
    }
  }
};

struct Trained {
  std::vector<float> params, m, v;
  std::vector<double> loss_sums, norms;
  std::vector<bool> applied;
};

// The per-step path TrainStep replaces.
Trained train_per_step(const std::vector<StepBatch>& batches) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(tiny_model(), *backend);
  model.initialize(5);
  AdamW adamw(model, clipping_optimizer());
  Trained out;
  const int per_micro = kShape.batch * kShape.seq_len;
  for (std::size_t s = 0; s < batches.size(); ++s) {
    model.zero_gradients();
    double loss_sum = 0.0;
    for (int micro = 0; micro < kShape.micro_batches; ++micro)
      loss_sum += model
                      .forward_backward(batches[s].tokens.data() + micro * per_micro,
                                        batches[s].targets.data() + micro * per_micro, kShape.batch, kShape.seq_len,
                                        kShape.grad_scale)
                      .sum;
    const OptimizerStepResult r = adamw.step(long(s) + 1, 1e-2 / double(s + 1));
    out.loss_sums.push_back(loss_sum);
    out.norms.push_back(r.grad_norm);
    out.applied.push_back(r.applied);
  }
  out.params = model.parameters_to_host();
  out.m = adamw.first_moment_to_host();
  out.v = adamw.second_moment_to_host();
  return out;
}

Trained train_with_train_step(const std::vector<StepBatch>& batches, bool time_phases = false) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(tiny_model(), *backend);
  model.initialize(5);
  AdamW adamw(model, clipping_optimizer());
  TrainStep step(model, adamw, kShape);
  step.time_phases(time_phases);
  Trained out;
  for (std::size_t s = 0; s < batches.size(); ++s) {
    step.enqueue(batches[s].tokens, batches[s].targets, long(s) + 1, 1e-2 / double(s + 1));
    const TrainStepResult r = step.result(long(s) + 1);
    out.loss_sums.push_back(r.loss_sum);
    out.norms.push_back(r.optimizer.grad_norm);
    out.applied.push_back(r.optimizer.applied);
    EXPECT_FALSE(step.replaying()) << "the CPU backend records nothing";
    EXPECT_EQ(r.phases.has_value(), time_phases);
    if (r.phases) {
      EXPECT_GT(r.phases->forward_backward, 0.0);
      EXPECT_GT(r.phases->update, 0.0);
      EXPECT_GE(r.phases->reduction, 0.0);
      EXPECT_GE(r.phases->gather, 0.0);
    }
  }
  out.params = model.parameters_to_host();
  out.m = adamw.first_moment_to_host();
  out.v = adamw.second_moment_to_host();
  return out;
}

std::vector<StepBatch> random_batches(int steps) {
  Rng rng(17);
  std::vector<StepBatch> batches;
  for (int s = 0; s < steps; ++s) batches.emplace_back(rng, tiny_model().vocab_size);
  return batches;
}

}  // namespace

TEST(TrainStep, EqualsThePerStepPathBitwise) {
  const auto batches = random_batches(4);
  const Trained want = train_per_step(batches);
  const Trained got = train_with_train_step(batches);
  EXPECT_EQ(got.loss_sums, want.loss_sums);
  EXPECT_EQ(got.norms, want.norms);
  EXPECT_EQ(got.applied, std::vector<bool>(4, true));
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.m, want.m);
  EXPECT_EQ(got.v, want.v);
  // The run did something: the loss sums are those of real tokens and the weights moved.
  for (double loss : got.loss_sums) EXPECT_GT(loss, 0.0);
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model initial(tiny_model(), *backend);
  initial.initialize(5);
  EXPECT_NE(got.params, initial.parameters_to_host());
}

TEST(TrainStep, ANonFiniteStepIsSkippedAndReported) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(tiny_model(), *backend);
  model.initialize(5);
  AdamW adamw(model, clipping_optimizer());
  TrainStep step(model, adamw, kShape);
  const auto batches = random_batches(2);
  step.enqueue(batches[0].tokens, batches[0].targets, 1, 1e-2);
  ASSERT_TRUE(step.result(1).optimizer.applied);

  // A NaN weight makes the loss and every gradient NaN: nothing may change, not even m and v.
  const std::size_t gain = std::size_t(model.layout().offset(model.layout().index_of("final_norm.weight")));
  model.parameters().as<float>()[gain] = std::numeric_limits<float>::quiet_NaN();
  const auto params = model.parameters_to_host();
  const auto m = adamw.first_moment_to_host(), v = adamw.second_moment_to_host();
  step.enqueue(batches[1].tokens, batches[1].targets, 2, 1e-2);
  const TrainStepResult r = step.result(2);
  EXPECT_FALSE(r.optimizer.applied);
  EXPECT_TRUE(std::isnan(r.loss_sum));
  EXPECT_TRUE(std::isnan(r.optimizer.grad_norm));
  const auto params_after = model.parameters_to_host();
  for (std::size_t i = 0; i < params.size(); ++i)
    if (i != gain) {
      ASSERT_EQ(params_after[i], params[i]) << "parameter " << i;
    }
  EXPECT_EQ(adamw.first_moment_to_host(), m);
  EXPECT_EQ(adamw.second_moment_to_host(), v);
}

TEST(TrainStep, TimingThePhasesChangesNoResult) {
  const auto batches = random_batches(3);
  const Trained plain = train_with_train_step(batches);
  const Trained timed = train_with_train_step(batches, true);
  EXPECT_EQ(timed.params, plain.params);
  EXPECT_EQ(timed.loss_sums, plain.loss_sums);
  EXPECT_EQ(timed.norms, plain.norms);
}

// The CPU's timed fences take the clock when recorded; the time between two is at least the
// time slept between them, and a fence not yet recorded cannot be measured.
TEST(TimedFence, CpuFencesMeasureTheTimeBetweenTheirRecords) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  auto first = backend->make_timed_fence(), second = backend->make_timed_fence();
  EXPECT_THROW(second->seconds_since(*first), std::logic_error);
  first->record();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  second->record();
  EXPECT_GE(second->seconds_since(*first), 0.02);
  EXPECT_LT(second->seconds_since(*first), 5.0);
  EXPECT_LE(first->seconds_since(*second), -0.02);
}

TEST(TrainStep, KeepsTheResultsOfTheLastTwoSteps) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(tiny_model(), *backend);
  model.initialize(5);
  AdamW adamw(model, clipping_optimizer());
  TrainStep step(model, adamw, kShape);
  const auto batches = random_batches(3);
  for (long s = 1; s <= 3; ++s) {
    const auto& batch = batches[std::size_t(s - 1)];
    step.enqueue(batch.tokens, batch.targets, s, 1e-3);
  }
  EXPECT_GT(step.result(2).loss_sum, 0.0);
  EXPECT_GT(step.result(3).loss_sum, 0.0);
  EXPECT_NE(step.result(2).loss_sum, step.result(3).loss_sum);
  try {
    step.result(1);
    FAIL() << "expected std::logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("no results kept for step 1"), std::string::npos) << e.what();
  }
}

TEST(TrainStep, RefusesBadShapesTokensAndSteps) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(tiny_model(), *backend);
  AdamW adamw(model, clipping_optimizer());
  EXPECT_THROW(TrainStep(model, adamw, TrainStepShape{0, 3, 5, 1.0}), std::invalid_argument);
  EXPECT_THROW(TrainStep(model, adamw, TrainStepShape{1, 3, -5, 1.0}), std::invalid_argument);

  TrainStep step(model, adamw, kShape);
  auto batch = random_batches(1)[0];
  const auto expect_error = [&](const std::string& fragment, long step_number) {
    try {
      step.enqueue(batch.tokens, batch.targets, step_number, 1e-3);
      FAIL() << "expected std::invalid_argument containing: " << fragment;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error("step is 0, expected >= 1", 0);
  batch.tokens[4] = 29;
  expect_error("token 29 at index 4 outside the vocabulary [0, 29)", 1);
  batch.tokens[4] = 1;
  batch.targets[6] = 40;
  expect_error("target 40 at index 6 is not below the vocabulary size 29", 1);
  batch.targets.pop_back();
  expect_error("30 tokens and 29 targets given, expected 2 micro-batches × 3 × 5 = 30 each", 1);
}
