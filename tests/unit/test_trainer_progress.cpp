// The progress lines' arithmetic (runtime/progress.hpp) and the schedule-change warning of a
// resume: pure functions, checked by value rather than by timing a run.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "pope/optim.hpp"
#include "runtime/progress.hpp"

using namespace pope;

namespace {

// 100 steps, validation every 30 (and the final one at 100), checkpoints every 40 (and at the end).
ProgressPlan plan_of(long end_step) {
  return {.end_step = end_step, .total_steps = 100, .evaluates = true, .eval_every = 30, .checkpoints = true,
          .checkpoint_every = 40};
}

}  // namespace

TEST(Progress, CountsTheEvaluationsAndCheckpointsLeft) {
  EXPECT_EQ(evaluations_from(plan_of(100), 1), 4);    // 30, 60, 90, and the final one at 100
  EXPECT_EQ(evaluations_from(plan_of(100), 30), 4);   // the one at 30 still to run
  EXPECT_EQ(evaluations_from(plan_of(100), 91), 1);
  EXPECT_EQ(evaluations_from(plan_of(50), 1), 1);     // --stop-at 50: no final evaluation
  EXPECT_EQ(checkpoints_from(plan_of(100), 1), 3);    // 40, 80, 100
  EXPECT_EQ(checkpoints_from(plan_of(50), 1), 2);     // 40 and the stop at 50
  EXPECT_EQ(checkpoints_from(plan_of(80), 41), 1);    // 80 is both
  EXPECT_EQ(checkpoints_from(plan_of(100), 101), 0);
  ProgressPlan quiet = plan_of(100);
  quiet.eval_every = 0;
  quiet.checkpoints = false;
  EXPECT_EQ(evaluations_from(quiet, 1), 1);  // the final evaluation only
  EXPECT_EQ(checkpoints_from(quiet, 1), 0);
  quiet.evaluates = false;
  EXPECT_EQ(evaluations_from(quiet, 1), 0);
}

TEST(Progress, EtaWaitsForAMeasurementThenAddsEvaluationsAndCheckpoints) {
  ProgressCosts costs;
  costs.evaluation_steps_estimate = 5.0;
  costs.checkpoint_seconds_estimate = 2.0;
  EXPECT_FALSE(eta_seconds(plan_of(100), costs, 10));
  EXPECT_EQ(format_eta(eta_seconds(plan_of(100), costs, 10)), "ETA (estimating)");
  costs.timed_steps = 9;
  costs.timed_seconds = 4.5;  // 0.5 s per step
  // After step 60's log line: 40 steps, the evaluations at 60, 90 and 100 (5 steps' time each
  // until one is timed), the checkpoints at 80 and 100.
  EXPECT_DOUBLE_EQ(*eta_seconds(plan_of(100), costs, 60), 40 * 0.5 + 3 * 2.5 + 2 * 2.0);
  costs.evaluation_seconds = 10.0;
  costs.checkpoint_seconds = 1.0;
  EXPECT_DOUBLE_EQ(*eta_seconds(plan_of(100), costs, 60), 40 * 0.5 + 3 * 10.0 + 2 * 1.0);
  // --stop-at 70: the evaluation at 60 and the checkpoint at the stop.
  EXPECT_DOUBLE_EQ(*eta_seconds(plan_of(70), costs, 60), 10 * 0.5 + 10.0 + 1.0);
  EXPECT_EQ(format_eta(eta_seconds(plan_of(70), costs, 60)), "ETA 16s");
}

TEST(Progress, FormatsDurationsShortly) {
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(-1), "?");
}

// train.steps 12 → 24 at step 4 (warmup 2, cosine): the decay's end moves and the rates differ.
TEST(ScheduleChange, NamesBothEndsAndTheRatesUnderEach) {
  OptimConfig optim;
  optim.lr = 1e-3;
  optim.min_lr = 1e-4;
  optim.warmup_steps = 2;
  const std::string message = describe_schedule_change(optim, 4, 12, 24);
  EXPECT_NE(message.find("train.steps is 24 instead of the run's 12: the cosine decay of the learning rate now ends "
                         "at step 24 instead of 12 (warmup ends at step 2 in both)"),
            std::string::npos)
      << message;
  const auto rate = [&](long step, long total) { return fmt::format("{:.2e}", learning_rate(optim, step - 1, total)); };
  for (long step : {5L, 12L, 24L})
    EXPECT_NE(message.find(fmt::format("step {} {} → {}", step, rate(step, 12), rate(step, 24))), std::string::npos)
        << message;
  EXPECT_EQ(describe_schedule_change(optim, 4, 12, 12), "");
  optim.schedule = LrSchedule::constant;  // no rate depends on train.steps
  EXPECT_EQ(describe_schedule_change(optim, 4, 12, 24), "");
}
