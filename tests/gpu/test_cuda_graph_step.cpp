// A training step without host synchronisation on the GPU: the device-side step ops against
// the CPU reference and against plain AdamW, and TrainStep recorded in a CUDA graph: replays
// give the same parameters as eager steps (bitwise; PoPE, and PJ-RoPE's `full`, whose bias
// kernels run on a side stream), PoPE's δ projected into its bounds inside the recording
// (delta_bound project), a non-finite step is skipped on the device, replays allocate
// nothing, and a reallocation of the activations is noticed; timed fences and phase timing
// (eager, the same results).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "cuda/cuda_device.hpp"
#include "cuda_op_test_support.hpp"
#include "pope/rng.hpp"
#include "pope/train_step.hpp"
#include "unit/model_shape.hpp"

using namespace pope;
using pope::test::download;
using pope::test::make_tensor;
using pope::test::poison;
using pope::test::random_bf16_values;
using pope::test::relative_error;

namespace {

class CudaGraphStep : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    gpu_ = make_backend(DeviceChoice::cuda);
    cpu_ = make_backend(DeviceChoice::cpu, "float", 0);
  }
  std::unique_ptr<Backend> gpu_, cpu_;
};

// PoPE with δ away from its zero init; `full` (PJ-RoPE) forks its bias kernels onto a side stream,
// which a recorded step must hold as graph edges.
ModelConfig small_model(const std::string& kind = "pope") {
  ModelConfig c = pope::testing::model_config(pope::testing::kGpuTestShape, kind);
  c.position.pope.delta_init = DeltaInit::uniform;
  return c;
}

OptimConfig clipping_optimizer() {
  OptimConfig oc;
  oc.weight_decay = 0.1;
  oc.grad_clip = 1.0;
  return oc;
}

constexpr TrainStepShape kShape{2, 3, 97, 1.0 / (2 * 3 * 97)};  // T not a multiple of any tile

struct StepBatch {
  std::vector<std::int32_t> tokens, targets;
};

std::vector<StepBatch> random_batches(int steps, int vocab) {
  Rng rng(23);
  std::vector<StepBatch> batches(static_cast<std::size_t>(steps));
  for (auto& b : batches)
    for (std::int64_t i = 0; i < kShape.tokens(); ++i) {
      b.tokens.push_back(std::int32_t(rng.below(std::uint64_t(vocab))));
      b.targets.push_back(i % 11 == 5 ? -1 : std::int32_t(rng.below(std::uint64_t(vocab))));
    }
  return batches;
}

double learning_rate_at(long step) { return 1e-3 / double(step); }

struct TrainedRun {
  std::vector<float> params, compute, m, v;  // compute: the compute copy (the masters without one)
  std::vector<double> loss_sums;
};

// `steps` optimizer steps through TrainStep, recorded in a graph or all eager (also when
// timing the phases, which are checked to be measured).
TrainedRun train(Backend& backend, const std::vector<StepBatch>& batches, bool use_graph, bool time_phases = false,
                 const ModelConfig& config = small_model()) {
  Model model(config, backend);
  model.initialize(9);
  AdamW adamw(model, clipping_optimizer());
  TrainStep step(model, adamw, kShape, use_graph);
  step.time_phases(time_phases);
  TrainedRun run;
  for (std::size_t s = 0; s < batches.size(); ++s) {
    const long number = long(s) + 1;
    step.enqueue(batches[s].tokens, batches[s].targets, number, learning_rate_at(number));
    const TrainStepResult r = step.result(number);
    EXPECT_TRUE(r.optimizer.applied) << "step " << number;
    run.loss_sums.push_back(r.loss_sum);
    if (use_graph && !time_phases) {
      EXPECT_EQ(step.replaying(), number >= 2) << "step " << number << ": eager once, then recorded";
    }
    EXPECT_EQ(r.phases.has_value(), time_phases);
    if (r.phases) {
      EXPECT_FALSE(step.replaying()) << "timed steps run eagerly";
      EXPECT_GT(r.phases->forward_backward, 0.0) << "step " << number;
      EXPECT_GT(r.phases->update, 0.0) << "step " << number;
      EXPECT_GE(r.phases->reduction, 0.0) << "step " << number;
      EXPECT_GE(r.phases->gather, 0.0) << "step " << number;
      EXPECT_LT(r.phases->total(), 10.0) << "step " << number;
    }
  }
  backend.synchronize();
  run.params = model.parameters_to_host();
  run.compute = tensor_to_host_f32(backend, model.compute_weights());
  run.m = adamw.first_moment_to_host();
  run.v = adamw.second_moment_to_host();
  return run;
}

}  // namespace

TEST_F(CudaGraphStep, AccumulateSumMatchesTheCpuAndIsDeterministic) {
  for (const int count : {1, 1000, 3 * 97 * 5 + 1}) {
    const auto values = random_bf16_values(std::size_t(count), std::uint64_t(count), 3.0f);
    OwnedTensor gpu_values = make_tensor(*gpu_, {count}, DType::f32, values);
    OwnedTensor cpu_values = make_tensor(*cpu_, {count}, DType::f32, values);
    const std::vector<float> zero = {0.0f}, start = {1.25f};
    OwnedTensor cpu_total = make_tensor(*cpu_, {1}, DType::f64, zero);
    cpu_->accumulate_sum(cpu_total.tensor, cpu_values.tensor);
    OwnedTensor sum = make_tensor(*gpu_, {1}, DType::f64, zero);
    gpu_->accumulate_sum(sum.tensor, gpu_values.tensor);
    const double s = download(*gpu_, sum.tensor)[0];
    const double want = download(*cpu_, cpu_total.tensor)[0];
    EXPECT_NEAR(s, want, 1e-12 * (1 + std::abs(want))) << count;

    // Adds to what the total holds, with the same bits every time.
    OwnedTensor total = make_tensor(*gpu_, {1}, DType::f64, start);
    gpu_->accumulate_sum(total.tensor, gpu_values.tensor);
    EXPECT_EQ(download(*gpu_, total.tensor)[0], 1.25 + s) << count;
    gpu_->accumulate_sum(total.tensor, gpu_values.tensor);
    EXPECT_EQ(download(*gpu_, total.tensor)[0], (1.25 + s) + s) << count;
  }
}

TEST_F(CudaGraphStep, SumOfSquaresIntoEqualsTheHostValue) {
  const auto values = random_bf16_values(123457, 3);
  OwnedTensor x = make_tensor(*gpu_, {123457}, DType::f32, values);
  OwnedTensor result = allocate_tensor(*gpu_, {1}, DType::f64);
  poison(*gpu_, result.tensor);
  gpu_->sum_of_squares_into(result.tensor, x.tensor);
  EXPECT_EQ(download(*gpu_, result.tensor)[0], gpu_->sum_of_squares(x.tensor));
}

// The guarded update equals adamw() with grad_scale = clip/norm, bitwise on the same GPU, and
// is a no-op (flag 0) for a non-finite loss or norm.
TEST_F(CudaGraphStep, GuardedAdamWEqualsAdamWAndSkipsNonFiniteSteps) {
  const int n = 70001;  // two chunks and an odd tail
  const std::vector<ParamSegment> segments = {{0, 50000, true}, {50000, n - 50000 - 3, false}};
  const auto params = random_bf16_values(std::size_t(n), 1), grads = random_bf16_values(std::size_t(n), 2, 4.0f);
  const auto m0 = random_bf16_values(std::size_t(n), 3, 0.1f);
  std::vector<float> v0;
  for (float x : random_bf16_values(std::size_t(n), 4, 0.1f)) v0.push_back(x * x);
  struct Arena {
    OwnedTensor p, g, m, v, copy;
  };
  auto arena = [&] {
    return Arena{make_tensor(*gpu_, {n}, DType::f32, params), make_tensor(*gpu_, {n}, DType::f32, grads),
                 make_tensor(*gpu_, {n}, DType::f32, m0), make_tensor(*gpu_, {n}, DType::f32, v0),
                 allocate_tensor(*gpu_, {n}, DType::bf16)};
  };
  AdamWHyper hyper;
  hyper.weight_decay = 0.1;
  hyper.grad_clip = 1.0;
  const long step_number = 3;
  const double lr = 2e-3;
  std::vector<double> schedule_host = {lr, 1 - std::pow(hyper.beta1, double(step_number)),
                                       1 - std::pow(hyper.beta2, double(step_number))};
  OwnedTensor schedule = allocate_tensor(*gpu_, {kStepScheduleSize}, DType::f64);
  gpu_->copy_from_host(schedule.tensor, schedule_host.data());

  Arena plain = arena();
  const double squares = gpu_->sum_of_squares(plain.g.tensor);
  AdamWStep step;
  step.lr = lr;
  step.beta1 = hyper.beta1;
  step.beta2 = hyper.beta2;
  step.eps = hyper.eps;
  step.weight_decay = hyper.weight_decay;
  step.step = step_number;
  step.grad_scale = clip_scale(hyper.grad_clip, std::sqrt(squares));
  ASSERT_LT(step.grad_scale, 1.0) << "the test means to clip";
  poison(*gpu_, plain.copy.tensor);
  gpu_->adamw(plain.p.tensor, plain.g.tensor, plain.m.tensor, plain.v.tensor, segments, step, plain.copy.tensor);

  Arena guarded = arena();
  poison(*gpu_, guarded.copy.tensor);
  std::vector<double> stats_host = {42.0, squares, -1.0};
  OwnedTensor stats = allocate_tensor(*gpu_, {kStepStatsSize}, DType::f64);
  gpu_->copy_from_host(stats.tensor, stats_host.data());
  gpu_->adamw_guarded(guarded.p.tensor, guarded.g.tensor, guarded.m.tensor, guarded.v.tensor, segments, hyper,
                      schedule.tensor, stats.tensor, guarded.copy.tensor);
  EXPECT_EQ(download(*gpu_, stats.tensor), (std::vector<double>{42.0, squares, 1.0}));
  EXPECT_EQ(download(*gpu_, guarded.p.tensor), download(*gpu_, plain.p.tensor));
  EXPECT_EQ(download(*gpu_, guarded.m.tensor), download(*gpu_, plain.m.tensor));
  EXPECT_EQ(download(*gpu_, guarded.v.tensor), download(*gpu_, plain.v.tensor));
  const auto copy = download(*gpu_, guarded.copy.tensor), plain_copy = download(*gpu_, plain.copy.tensor);
  for (int i = 0; i < n - 3; ++i) ASSERT_EQ(copy[std::size_t(i)], plain_copy[std::size_t(i)]) << "element " << i;

  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [loss_sum, sq] : {std::pair{nan, squares}, std::pair{1.0, nan}}) {
    Arena skipped = arena();
    stats_host = {loss_sum, sq, -1.0};
    gpu_->copy_from_host(stats.tensor, stats_host.data());
    gpu_->adamw_guarded(skipped.p.tensor, skipped.g.tensor, skipped.m.tensor, skipped.v.tensor, segments, hyper,
                        schedule.tensor, stats.tensor, Tensor{});
    EXPECT_EQ(download(*gpu_, stats.tensor)[kStatsApplied], 0.0);
    const auto p_after = download(*gpu_, skipped.p.tensor), m_after = download(*gpu_, skipped.m.tensor);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(p_after[std::size_t(i)], double(params[std::size_t(i)])) << "element " << i;
      ASSERT_EQ(m_after[std::size_t(i)], double(m0[std::size_t(i)])) << "element " << i;
    }
  }
}

TEST_F(CudaGraphStep, AsyncCopiesNeedPageLockedMemory) {
  OwnedTensor device = allocate_tensor(*gpu_, {16}, DType::i32);
  std::vector<std::int32_t> pageable(16, 3);
  try {
    gpu_->copy_from_host_async(device.tensor, pageable.data());
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not page-locked"), std::string::npos) << e.what();
  }
  Buffer pinned = gpu_->allocate_host(16 * sizeof(std::int32_t));
  auto* host = static_cast<std::int32_t*>(pinned.get());
  for (int i = 0; i < 16; ++i) host[i] = 100 + i;
  gpu_->copy_from_host_async(device.tensor, host);
  Buffer back = gpu_->allocate_host(16 * sizeof(std::int32_t));
  gpu_->copy_to_host_async(back.get(), device.tensor);
  const auto fence = gpu_->make_fence();
  fence->record();
  fence->wait();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(static_cast<std::int32_t*>(back.get())[i], 100 + i);
}

TEST_F(CudaGraphStep, ReplayedStepsEqualEagerStepsBitwise) {
  for (const std::string kind : {"pope", "full"}) {
    SCOPED_TRACE(kind);
    const auto batches = random_batches(5, small_model(kind).vocab_size);
    const TrainedRun eager = train(*gpu_, batches, false, false, small_model(kind));
    const TrainedRun graph = train(*gpu_, batches, true, false, small_model(kind));
    EXPECT_EQ(graph.loss_sums, eager.loss_sums);
    EXPECT_EQ(graph.params, eager.params);
    EXPECT_EQ(graph.m, eager.m);
    EXPECT_EQ(graph.v, eager.v);
    // ...and the run is a real one: the loss is near log(vocab) per token at the start.
    const auto& targets = batches[0].targets;
    const auto unmasked = std::count_if(targets.begin(), targets.end(), [](int t) { return t >= 0; });
    const double first_mean = eager.loss_sums[0] / double(unmasked);
    EXPECT_NEAR(first_mean, std::log(500.0), 1.0);
  }
}

// delta_bound project with δ starting at 0, so that the first steps carry entries past 0: the
// recorded steps hold the projection (replays equal eager steps bitwise), every δ lies in
// [−2π, 0] (f32) with some exactly on 0 where delta_bound none leaves some above it, the bf16
// compute copy of δ is the rounding of its projected master, and the losses follow the CPU's.
TEST_F(CudaGraphStep, RecordedStepsProjectPopeDeltaIntoItsBounds) {
  ModelConfig config = small_model();
  config.position.pope.delta_init = DeltaInit::zero;
  const auto batches = random_batches(5, config.vocab_size);
  config.position.pope.delta_bound = DeltaBound::none;
  const TrainedRun unbounded = train(*gpu_, batches, true, false, config);
  config.position.pope.delta_bound = DeltaBound::project;
  const TrainedRun eager = train(*gpu_, batches, false, false, config);
  const TrainedRun graph = train(*gpu_, batches, true, false, config);
  const TrainedRun cpu = train(*cpu_, batches, false, false, config);
  EXPECT_EQ(graph.params, eager.params);
  EXPECT_EQ(graph.compute, eager.compute);
  ASSERT_EQ(graph.loss_sums.size(), cpu.loss_sums.size());
  for (std::size_t s = 0; s < cpu.loss_sums.size(); ++s)
    EXPECT_NEAR(graph.loss_sums[s], cpu.loss_sums[s], 2e-2 * cpu.loss_sums[s]) << "step " << s + 1;
  const float lowest = float(-2.0 * std::numbers::pi);
  const ParameterLayout layout = build_parameter_layout(config, *make_position_encoding(config));
  int on_zero = 0, above_unbounded = 0, cpu_on_zero = 0;
  for (int l = 0; l < config.n_layer; ++l) {
    const std::size_t index = layout.index_of("layers." + std::to_string(l) + ".position.delta");
    const std::size_t first = std::size_t(layout.offset(index));
    for (std::size_t i = first; i < first + std::size_t(shape_numel(layout.specs()[index].shape)); ++i) {
      ASSERT_TRUE(graph.params[i] >= lowest && graph.params[i] <= 0.0f) << "δ " << graph.params[i] << " at " << i;
      ASSERT_TRUE(cpu.params[i] >= lowest && cpu.params[i] <= 0.0f) << "CPU δ " << cpu.params[i] << " at " << i;
      ASSERT_EQ(graph.compute[i], bf16_to_float(float_to_bf16(graph.params[i]))) << "compute copy of δ at " << i;
      on_zero += graph.params[i] == 0.0f;
      cpu_on_zero += cpu.params[i] == 0.0f;
      above_unbounded += unbounded.params[i] > 0.0f;
    }
  }
  EXPECT_GT(on_zero, 0);
  EXPECT_GT(cpu_on_zero, 0);
  EXPECT_GT(above_unbounded, 0);
}

TEST_F(CudaGraphStep, TimedStepsGiveTheEagerResultsAndTheirPhases) {
  const auto batches = random_batches(3, small_model().vocab_size);
  const TrainedRun eager = train(*gpu_, batches, false);
  const TrainedRun timed = train(*gpu_, batches, true, true);
  EXPECT_EQ(timed.loss_sums, eager.loss_sums);
  EXPECT_EQ(timed.params, eager.params);
}

// Timing switched on after the step was recorded: the recording is dropped, the next step runs
// eagerly and reports its phases.
TEST_F(CudaGraphStep, TimingStartedAfterARecordingRunsEagerly) {
  const auto batches = random_batches(4, small_model().vocab_size);
  Model model(small_model(), *gpu_);
  model.initialize(9);
  AdamW adamw(model, clipping_optimizer());
  TrainStep step(model, adamw, kShape, true);
  for (long number = 1; number <= 3; ++number) {
    step.enqueue(batches[std::size_t(number - 1)].tokens, batches[std::size_t(number - 1)].targets, number,
                 learning_rate_at(number));
    EXPECT_FALSE(step.result(number).phases.has_value());
  }
  ASSERT_TRUE(step.replaying());
  step.time_phases(true);
  step.enqueue(batches[3].tokens, batches[3].targets, 4, learning_rate_at(4));
  const TrainStepResult r = step.result(4);
  ASSERT_TRUE(r.phases.has_value());
  EXPECT_GT(r.phases->forward_backward, 0.0);
  EXPECT_FALSE(step.replaying());
}

// A timed fence pair brackets work on the stream: a 256 MiB fill takes tens of microseconds
// at least; an unrecorded fence is refused rather than read as zero.
TEST_F(CudaGraphStep, TimedFencesMeasureTheWorkBetweenThem) {
  auto before = gpu_->make_timed_fence(), after = gpu_->make_timed_fence();
  const OwnedTensor big = allocate_tensor(*gpu_, {std::int64_t(64) << 20}, DType::f32);
  gpu_->synchronize();
  before->record();
  EXPECT_THROW(after->seconds_since(*before), std::logic_error);
  gpu_->fill(big.tensor, 1.0);
  after->record();
  after->wait();
  const double seconds = after->seconds_since(*before);
  EXPECT_GT(seconds, 2e-5);
  EXPECT_LT(seconds, 1.0);
}

TEST_F(CudaGraphStep, ANonFiniteStepIsSkippedOnTheDevice) {
  Model model(small_model(), *gpu_);
  model.initialize(9);
  AdamW adamw(model, clipping_optimizer());
  TrainStep step(model, adamw, kShape);
  const auto batches = random_batches(5, small_model().vocab_size);
  for (long s = 1; s <= 3; ++s) {
    const auto& batch = batches[std::size_t(s - 1)];
    step.enqueue(batch.tokens, batch.targets, s, 1e-3);
  }
  ASSERT_TRUE(step.result(3).optimizer.applied);
  ASSERT_TRUE(step.replaying());

  const Tensor gain = model.layout().view(model.parameters(), "final_norm.weight").rows(0, 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  gpu_->copy_from_host(gain, &nan);
  model.refresh_compute_weights();
  const auto params = model.parameters_to_host();
  const auto m = adamw.first_moment_to_host(), v = adamw.second_moment_to_host();
  step.enqueue(batches[3].tokens, batches[3].targets, 4, 1e-3);
  const TrainStepResult skipped = step.result(4);
  EXPECT_FALSE(skipped.optimizer.applied);
  EXPECT_TRUE(std::isnan(skipped.loss_sum));
  EXPECT_TRUE(step.replaying()) << "the skip happened inside the recorded step";
  const auto after = model.parameters_to_host();
  ASSERT_EQ(after.size(), params.size());
  for (std::size_t i = 0; i < after.size(); ++i)
    if (!std::isnan(params[i])) {
      ASSERT_EQ(after[i], params[i]) << "parameter " << i;
    }
  EXPECT_EQ(adamw.first_moment_to_host(), m);
  EXPECT_EQ(adamw.second_moment_to_host(), v);

  const float one = 1.0f;
  gpu_->copy_from_host(gain, &one);
  model.refresh_compute_weights();
  step.enqueue(batches[4].tokens, batches[4].targets, 5, 1e-3);
  EXPECT_TRUE(step.result(5).optimizer.applied) << "the next finite step is applied again";
}

TEST_F(CudaGraphStep, ReplaysAllocateNothingAndAReallocationIsNoticed) {
  Model model(small_model(), *gpu_);
  model.initialize(9);
  AdamW adamw(model, clipping_optimizer());
  TrainStep step(model, adamw, kShape);
  const auto batches = random_batches(8, small_model().vocab_size);
  step.enqueue(batches[0].tokens, batches[0].targets, 1, 1e-3);
  step.enqueue(batches[1].tokens, batches[1].targets, 2, 1e-3);  // records, then replays
  gpu_->synchronize();
  ASSERT_TRUE(step.replaying());
  std::size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  for (long s = 3; s <= 7; ++s) {
    const auto& batch = batches[std::size_t(s - 1)];
    step.enqueue(batch.tokens, batch.targets, s, 1e-3);
  }
  gpu_->synchronize();
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(free_after, free_before);
  EXPECT_TRUE(step.result(7).optimizer.applied);

  // An evaluation of another batch size reallocates the activations the recording writes.
  std::vector<std::int32_t> tokens(2 * 97, 1), targets(2 * 97, 2);
  model.forward(tokens.data(), targets.data(), 2, 97);
  EXPECT_FALSE(step.replaying());
  step.enqueue(batches[7].tokens, batches[7].targets, 8, 1e-3);  // eager again on the new buffers
  EXPECT_FALSE(step.replaying()) << "one eager step before recording again";
  const TrainStepResult r = step.result(8);
  EXPECT_TRUE(r.optimizer.applied);
  EXPECT_TRUE(std::isfinite(r.loss_sum));
  step.enqueue(batches[0].tokens, batches[0].targets, 9, 1e-3);
  EXPECT_TRUE(step.replaying());
  EXPECT_TRUE(step.result(9).optimizer.applied);
}
