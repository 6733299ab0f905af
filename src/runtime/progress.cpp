#include "runtime/progress.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace pope {

namespace {

// Multiples of `every` in [first, last].
long multiples_in(long every, long first, long last) {
  if (every <= 0 || last < first) return 0;
  return last / every - (first - 1) / every;
}

}  // namespace

long evaluations_from(const ProgressPlan& plan, long first) {
  if (!plan.evaluates || first > plan.end_step) return 0;
  const long periodic = multiples_in(plan.eval_every, first, plan.end_step);
  // The final evaluation runs at train.steps even off the eval_every grid; --stop-at before it skips it.
  const bool final_extra = plan.end_step == plan.total_steps && (plan.eval_every <= 0 || plan.total_steps % plan.eval_every != 0);
  return periodic + (final_extra ? 1 : 0);
}

long checkpoints_from(const ProgressPlan& plan, long first) {
  if (!plan.checkpoints || first > plan.end_step) return 0;
  const long periodic = multiples_in(plan.checkpoint_every, first, plan.end_step);
  const bool last_extra = plan.checkpoint_every <= 0 || plan.end_step % plan.checkpoint_every != 0;
  return periodic + (last_extra ? 1 : 0);
}

std::optional<double> ProgressCosts::step_seconds() const {
  if (timed_steps <= 0) return std::nullopt;
  return timed_seconds / double(timed_steps);
}

std::optional<double> eta_seconds(const ProgressPlan& plan, const ProgressCosts& costs, long step) {
  const std::optional<double> per_step = costs.step_seconds();
  if (!per_step) return std::nullopt;
  const double evaluation = costs.evaluation_seconds.value_or(costs.evaluation_steps_estimate * *per_step);
  const double checkpoint = costs.checkpoint_seconds.value_or(costs.checkpoint_seconds_estimate);
  const long steps_left = std::max(0L, plan.end_step - step);
  return double(steps_left) * *per_step + double(evaluations_from(plan, step)) * evaluation +
         double(checkpoints_from(plan, step + 1)) * checkpoint;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string format_eta(std::optional<double> seconds) {
  return seconds ? "ETA " + format_duration(*seconds) : std::string("ETA (estimating)");
}

}  // namespace pope
