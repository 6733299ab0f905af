// The arithmetic of the training log's progress lines: what is left of a run (steps,
// evaluations, checkpoints) and its ETA from measured or estimated costs. Pure functions,
// no clock: the trainer measures, these add up.
#pragma once

#include <optional>
#include <string>

namespace pope {

// The events of a run from one step to its end, as the trainer schedules them.
struct ProgressPlan {
  long end_step = 0;          // the last step this process takes: train.steps, or --stop-at when smaller
  long total_steps = 0;       // train.steps, whose step has the final evaluation
  bool evaluates = false;     // there is validation data (or the task's validation split)
  int eval_every = 0;         // train.eval_every; 0: the final evaluation only
  bool checkpoints = true;    // false: --no-checkpoints
  int checkpoint_every = 0;   // train.checkpoint_every; 0: at end_step only
};

// Evaluations at steps first..end_step, and checkpoints at steps first..end_step.
long evaluations_from(const ProgressPlan& plan, long first);
long checkpoints_from(const ProgressPlan& plan, long first);

// What a step, an evaluation and a checkpoint cost: the mean training time per step once
// timed, the last evaluation's and checkpoint's times once one ran, estimates until then.
struct ProgressCosts {
  long timed_steps = 0;                      // steps whose training time was measured
  double timed_seconds = 0.0;                // their training time (evaluations, checkpoints, samples excluded)
  std::optional<double> evaluation_seconds;  // the last evaluation's time
  std::optional<double> checkpoint_seconds;  // the last checkpoint's time
  double evaluation_steps_estimate = 0.0;    // an evaluation's cost in training steps, until one is timed
  double checkpoint_seconds_estimate = 0.0;  // a checkpoint's time, until one is timed

  std::optional<double> step_seconds() const;
};

// Seconds from the log line of `step` (its training and checkpoint done, its evaluation not
// yet) to the end of end_step's work; nullopt until a step's training time was measured.
std::optional<double> eta_seconds(const ProgressPlan& plan, const ProgressCosts& costs, long step);

// "42s", "3m05s", "1h02m"; "?" for a negative or non-finite time.
std::string format_duration(double seconds);
// "ETA 3m05s", or "ETA (estimating)" without a measurement.
std::string format_eta(std::optional<double> seconds);

}  // namespace pope
