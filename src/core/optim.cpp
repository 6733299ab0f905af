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
}

OptimizerStepResult AdamW::step(long step, double lr) {
  Backend& be = model_.backend();
  OptimizerStepResult result;
  result.grad_norm = std::sqrt(be.sum_of_squares(model_.gradients()));
  if (!std::isfinite(result.grad_norm)) return result;
  if (config_.grad_clip > 0.0 && result.grad_norm > config_.grad_clip)
    result.clip_scale = config_.grad_clip / result.grad_norm;
  AdamWStep s;
  s.lr = lr;
  s.beta1 = config_.beta1;
  s.beta2 = config_.beta2;
  s.eps = config_.eps;
  s.weight_decay = config_.weight_decay;
  s.step = step;
  s.grad_scale = result.clip_scale;
  const Tensor compute = model_.compute_weights();
  const bool separate = compute.data != model_.parameters().data;
  be.adamw(model_.parameters(), model_.gradients(), m_.tensor, v_.tensor, segments_, s, separate ? compute : Tensor{});
  result.applied = true;
  return result;
}

std::vector<float> AdamW::first_moment_to_host() const { return tensor_to_host_f32(model_.backend(), m_.tensor); }
std::vector<float> AdamW::second_moment_to_host() const { return tensor_to_host_f32(model_.backend(), v_.tensor); }

void AdamW::moments_from_host(std::span<const float> m, std::span<const float> v) {
  tensor_from_host_f32(model_.backend(), m_.tensor, m);
  tensor_from_host_f32(model_.backend(), v_.tensor, v);
}

}  // namespace pope
