#include "pope/optim.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace pope {

double learning_rate(const OptimConfig& c, long step, long total_steps) {
  if (step < c.warmup_steps) return c.lr * double(step + 1) / double(c.warmup_steps);
  if (c.schedule == "constant") return c.lr;
  const long decay_steps = total_steps - c.warmup_steps;
  if (decay_steps <= 0 || step >= total_steps) return c.min_lr;
  const double progress = double(step - c.warmup_steps) / double(decay_steps);
  const double coefficient =
      c.schedule == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return c.min_lr + coefficient * (c.lr - c.min_lr);
}

AdamW::AdamW(Model& model, const OptimConfig& config)
    : model_(model), config_(config), segments_(model.segments()) {
  const Tensor p = model.parameters();
  m_ = allocate_tensor(model.backend(), p.shape, p.dtype);
  v_ = allocate_tensor(model.backend(), p.shape, p.dtype);
  schedule_ = allocate_tensor(model.backend(), {kStepScheduleSize}, DType::f64);
  stats_ = allocate_tensor(model.backend(), {kStepStatsSize}, DType::f64);
}

std::array<double, kStepScheduleSize> AdamW::schedule(long step, double lr) const {
  if (step < 1)
    throw std::invalid_argument(fmt::format("AdamW: step is {}, expected >= 1 (1-based for bias correction)", step));
  std::array<double, kStepScheduleSize> values{};
  values[kScheduleLr] = lr;
  values[kScheduleCorrection1] = 1 - std::pow(config_.beta1, double(step));
  values[kScheduleCorrection2] = 1 - std::pow(config_.beta2, double(step));
  return values;
}

void AdamW::step_on_device(Tensor schedule, Tensor stats) {
  Backend& be = model_.backend();
  be.sum_of_squares_into(stats.rows(kStatsGradSquares, kStatsGradSquares + 1), model_.gradients());
  AdamWHyper hyper;
  hyper.beta1 = config_.beta1;
  hyper.beta2 = config_.beta2;
  hyper.eps = config_.eps;
  hyper.weight_decay = config_.weight_decay;
  hyper.grad_clip = config_.grad_clip;
  const Tensor compute = model_.compute_weights();
  const bool separate = compute.data != model_.parameters().data;
  be.adamw_guarded(model_.parameters(), model_.gradients(), m_.tensor, v_.tensor, segments_, hyper, schedule, stats,
                   separate ? compute : Tensor{});
}

OptimizerStepResult AdamW::result_from(std::span<const double, kStepStatsSize> stats) const {
  OptimizerStepResult result;
  result.grad_norm = std::sqrt(stats[kStatsGradSquares]);
  result.applied = stats[kStatsApplied] != 0.0;
  if (result.applied) result.clip_scale = clip_scale(config_.grad_clip, result.grad_norm);
  return result;
}

OptimizerStepResult AdamW::step(long step, double lr) {
  Backend& be = model_.backend();
  const auto values = schedule(step, lr);
  be.copy_from_host(schedule_.tensor, values.data());
  be.fill(stats_.tensor, 0.0);  // a zero loss sum: only the gradient norm decides here
  step_on_device(schedule_.tensor, stats_.tensor);
  std::array<double, kStepStatsSize> stats{};
  be.copy_to_host(stats.data(), stats_.tensor);
  return result_from(stats);
}

std::vector<float> AdamW::first_moment_to_host() const { return tensor_to_host_f32(model_.backend(), m_.tensor); }
std::vector<float> AdamW::second_moment_to_host() const { return tensor_to_host_f32(model_.backend(), v_.tensor); }

void AdamW::moments_from_host(std::span<const float> m, std::span<const float> v) {
  tensor_from_host_f32(model_.backend(), m_.tensor, m);
  tensor_from_host_f32(model_.backend(), v_.tensor, v);
}

}  // namespace pope
