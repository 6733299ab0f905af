// The CPU backend's ops for a training step without host reads: the loss accumulator, the
// squared norm left in memory, AdamW guarded by device-side values (equal to plain AdamW,
// bit for bit, when finite; a no-op that says so when not), and the asynchronous copies,
// fences and graph capability of a backend that runs everything at once.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cpu/cpu_backend.hpp"
#include "cpu_gradient_check.hpp"

using namespace pope;
using pope::test::host_tensor;
using pope::test::random_values;

namespace {

std::vector<float> random_floats(std::size_t count, std::uint64_t seed, double scale = 1.0) {
  const std::vector<double> values = random_values(count, seed, scale);
  return {values.begin(), values.end()};
}

// An arena of 302 elements: three segments (one decayed) and two padding elements (250, 301)
// that no segment covers, with random weights, gradients and moments.
struct Arena {
  static constexpr int kSize = 302;
  std::vector<float> params = random_floats(kSize, 1), grads = random_floats(kSize, 2, 3.0);
  std::vector<float> m = random_floats(kSize, 3, 0.1), v;
  std::vector<float> copy = std::vector<float>(kSize, 0.0f);
  std::vector<ParamSegment> segments = {{0, 200, true}, {200, 50, false}, {251, 50, false}};
  Arena() {
    for (float x : random_floats(kSize, 4, 0.1)) v.push_back(x * x);
  }
  Tensor t(std::vector<float>& values) { return host_tensor(values, {kSize}); }
};

AdamWHyper hyper_with_clip(double clip) {
  AdamWHyper h;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  h.grad_clip = clip;
  return h;
}

// adamw_guarded's inputs for update `step` at `lr`, with the loss sum and squared norm given.
struct DeviceStep {
  std::vector<double> schedule, stats;
  DeviceStep(const AdamWHyper& h, long step, double lr, double loss_sum, double squares)
      : schedule{lr, 1 - std::pow(h.beta1, double(step)), 1 - std::pow(h.beta2, double(step))},
        stats{loss_sum, squares, -1.0} {}
};

}  // namespace

TEST(StepOps, AccumulateSumAddsTheSumOfTheValues) {
  auto backend = make_cpu_backend("float", 1);
  std::vector<float> values = random_floats(1000, 7);
  std::vector<double> total = {2.5};
  double expected = 0.0;
  for (float x : values) expected += double(x);
  backend->accumulate_sum(host_tensor(total, {1}), host_tensor(values, {1000}));
  EXPECT_EQ(total[0], 2.5 + expected);
  backend->accumulate_sum(host_tensor(total, {1}), host_tensor(values, {1000}));
  EXPECT_EQ(total[0], (2.5 + expected) + expected) << "a second call adds again";

  std::vector<float> wrong_total = {0.0f};
  try {
    backend->accumulate_sum(host_tensor(wrong_total, {1}), host_tensor(values, {1000}));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("accumulate_sum: total is f32 [1], expected f64 with 1 elements"),
              std::string::npos)
        << e.what();
  }
}

TEST(StepOps, SumOfSquaresIntoEqualsTheHostValue) {
  auto backend = make_cpu_backend("float", 3);
  std::vector<float> x = random_floats(10000, 8);
  std::vector<double> result = {-1.0};
  backend->sum_of_squares_into(host_tensor(result, {1}), host_tensor(x, {10000}));
  EXPECT_EQ(result[0], backend->sum_of_squares(host_tensor(x, {10000})));
  EXPECT_GT(result[0], 0.0);
  std::vector<double> two(2);
  EXPECT_THROW(backend->sum_of_squares_into(host_tensor(two, {2}), host_tensor(x, {10000})), std::invalid_argument);
}

// Clipping on and off, and a norm below the clip: the guarded update is plain AdamW with
// grad_scale = min(1, clip/norm), bit for bit.
TEST(StepOps, GuardedAdamWEqualsAdamWWithTheClipScale) {
  auto backend = make_cpu_backend("float", 2);
  for (const double clip : {0.0, 1.0, 1e6}) {
    Arena plain, guarded;
    const AdamWHyper h = hyper_with_clip(clip);
    const double squares = backend->sum_of_squares(plain.t(plain.grads));
    const double norm = std::sqrt(squares);
    AdamWStep step;
    step.lr = 3e-3;
    step.beta1 = h.beta1;
    step.beta2 = h.beta2;
    step.eps = h.eps;
    step.weight_decay = h.weight_decay;
    step.step = 7;
    step.grad_scale = clip > 0 && norm > clip ? clip / norm : 1.0;
    backend->adamw(plain.t(plain.params), plain.t(plain.grads), plain.t(plain.m), plain.t(plain.v), plain.segments,
                   step, plain.t(plain.copy));

    DeviceStep device(h, 7, 3e-3, 12.5, squares);
    backend->adamw_guarded(guarded.t(guarded.params), guarded.t(guarded.grads), guarded.t(guarded.m),
                           guarded.t(guarded.v), guarded.segments, h, host_tensor(device.schedule, {3}),
                           host_tensor(device.stats, {3}), guarded.t(guarded.copy));
    EXPECT_EQ(device.stats[kStatsApplied], 1.0) << "clip " << clip;
    EXPECT_EQ(device.stats[kStatsLossSum], 12.5) << "inputs stay";
    EXPECT_EQ(guarded.params, plain.params) << "clip " << clip;
    EXPECT_EQ(guarded.m, plain.m) << "clip " << clip;
    EXPECT_EQ(guarded.v, plain.v) << "clip " << clip;
    EXPECT_EQ(guarded.copy, plain.copy) << "clip " << clip;
    for (const std::size_t padding : {250u, 301u})
      EXPECT_EQ(guarded.params[padding], Arena().params[padding]) << "padding " << padding << " untouched";
  }
  EXPECT_EQ(clip_scale(1.0, 4.0), 0.25);
  EXPECT_EQ(clip_scale(1.0, 0.5), 1.0);
  EXPECT_EQ(clip_scale(0.0, 4.0), 1.0);
}

TEST(StepOps, GuardedAdamWSkipsANonFiniteLossOrNorm) {
  auto backend = make_cpu_backend("float", 1);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::pair<double, double> cases[] = {{nan, 1.0}, {inf, 1.0}, {1.0, nan}, {1.0, inf}};
  for (const auto& [loss_sum, squares] : cases) {
    Arena arena;
    const Arena before;
    DeviceStep device(hyper_with_clip(1.0), 1, 1e-3, loss_sum, squares);
    backend->adamw_guarded(arena.t(arena.params), arena.t(arena.grads), arena.t(arena.m), arena.t(arena.v),
                           arena.segments, hyper_with_clip(1.0), host_tensor(device.schedule, {3}),
                           host_tensor(device.stats, {3}), arena.t(arena.copy));
    EXPECT_EQ(device.stats[kStatsApplied], 0.0) << "loss " << loss_sum << ", squares " << squares;
    EXPECT_EQ(arena.params, before.params);
    EXPECT_EQ(arena.m, before.m);
    EXPECT_EQ(arena.v, before.v);
    EXPECT_EQ(arena.copy, before.copy) << "the compute copy is not written either";
  }
}

TEST(StepOps, GuardedAdamWNamesABadScheduleOrStatsTensor) {
  auto backend = make_cpu_backend("float", 1);
  Arena arena;
  std::vector<double> schedule(2), stats(3);
  std::vector<float> float_stats(3);
  auto call = [&](Tensor schedule_tensor, Tensor stats_tensor) {
    backend->adamw_guarded(arena.t(arena.params), arena.t(arena.grads), arena.t(arena.m), arena.t(arena.v),
                           arena.segments, hyper_with_clip(1.0), schedule_tensor, stats_tensor, Tensor{});
  };
  try {
    call(host_tensor(schedule, {2}), host_tensor(stats, {3}));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("adamw_guarded: schedule is f64 [2], expected f64 with 3 elements"),
              std::string::npos)
        << e.what();
  }
  schedule.resize(3);
  EXPECT_THROW(call(host_tensor(schedule, {3}), host_tensor(float_stats, {3})), std::invalid_argument);
}

TEST(StepOps, CpuCopiesAtOnceAndCannotRecordGraphs) {
  auto backend = make_cpu_backend("float", 1);
  OwnedTensor device = allocate_tensor(*backend, {4}, DType::i32);
  Buffer staging = backend->allocate_host(4 * sizeof(std::int32_t));
  auto* host = static_cast<std::int32_t*>(staging.get());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(host[i], 0) << "zero-filled";
  for (int i = 0; i < 4; ++i) host[i] = 10 + i;
  backend->copy_from_host_async(device.tensor, host);
  for (int i = 0; i < 4; ++i) host[i] = 0;  // the CPU copy is already done
  std::vector<std::int32_t> back(4);
  backend->copy_to_host_async(back.data(), device.tensor);
  const auto fence = backend->make_fence();
  fence->record();
  fence->wait();
  EXPECT_EQ(back, (std::vector<std::int32_t>{10, 11, 12, 13}));

  EXPECT_FALSE(backend->supports_graphs());
  try {
    backend->make_graph_capture();
    FAIL() << "expected std::logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot record work for replay"), std::string::npos) << e.what();
  }
}
