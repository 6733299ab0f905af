#include "pope/optim.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace pope {

double learning_rate(const OptimConfig& c, long step, long total_steps) {
  if (step < c.warmup_steps) return c.lr * double(step + 1) / double(c.warmup_steps);
  if (c.schedule == LrSchedule::constant) return c.lr;
  const long decay_steps = total_steps - c.warmup_steps;
  if (decay_steps <= 0 || step >= total_steps) return c.min_lr;
  const double progress = double(step - c.warmup_steps) / double(decay_steps);
  const double coefficient =
      c.schedule == LrSchedule::linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return c.min_lr + coefficient * (c.lr - c.min_lr);
}

std::string describe_schedule_change(const OptimConfig& config, long resume_step, long old_steps, long new_steps) {
  // Log lines count steps from 1: "step N" trains with the rate of 0-based step N − 1.
  std::vector<long> shown{resume_step + 1, std::min(old_steps, new_steps), std::max(old_steps, new_steps)};
  std::sort(shown.begin(), shown.end());
  shown.erase(std::unique(shown.begin(), shown.end()), shown.end());
  std::vector<std::string> rates;
  bool changed = false;
  for (long step : shown) {
    if (step <= resume_step) continue;
    const double before = learning_rate(config, step - 1, old_steps), after = learning_rate(config, step - 1, new_steps);
    changed = changed || before != after;
    rates.push_back(fmt::format("step {} {:.2e} → {:.2e}", step, before, after));
  }
  if (!changed) return {};
  return fmt::format("train.steps is {} instead of the run's {}: the {} decay of the learning rate now ends at "
                     "step {} instead of {} (warmup ends at step {} in both); lr at {}",
                     new_steps, old_steps, name_of(config.schedule), new_steps, old_steps, config.warmup_steps,
                     fmt::join(rates, ", "));
}

namespace {

// The segments' parts inside [begin, end), with offsets relative to begin: a tensor cut by
// a shard edge keeps its weight-decay flag and bounds on both sides.
std::vector<ParamSegment> segments_within(std::span<const ParamSegment> segments, std::int64_t begin,
                                          std::int64_t end) {
  std::vector<ParamSegment> cut;
  for (const ParamSegment& segment : segments) {
    const std::int64_t first = std::max(segment.offset, begin);
    const std::int64_t last = std::min(segment.offset + segment.numel, end);
    if (first < last) cut.push_back({first - begin, last - first, segment.weight_decay, segment.bounds});
  }
  return cut;
}

// Projected gradient descent: each bounded segment of an updated chunk is clamped into its
// bounds, and its compute copy (if any) converted again from the clamped masters, as the update
// itself converts them. Queued on the backend's stream after the update, so that a recorded step
// holds it and, sharded, the owner's projected values are what the ranks gather.
void project_into_bounds(Backend& be, std::span<const ParamSegment> segments, const Tensor& params,
                         const Tensor& compute) {
  for (const ParamSegment& segment : segments) {
    if (!segment.bounds) continue;
    const Tensor master = params.rows(segment.offset, segment.offset + segment.numel);
    be.clamp(master, segment.bounds->lowest, segment.bounds->highest);
    if (compute.data != nullptr) be.convert(compute.rows(segment.offset, segment.offset + segment.numel), master);
  }
}

}  // namespace

AdamW::AdamW(Model& model, const OptimConfig& config, Communicator* shard_over)
    : model_(model), config_(config) {
  const Tensor arena = model.padded_parameters();
  shard_end_ = model.parameters().numel();  // unsharded: the whole arena, without any padding
  if (shard_over != nullptr && shard_over->size() > 1) {
    const int ranks = shard_over->size();
    if (arena.numel() % ranks != 0)
      throw std::invalid_argument(fmt::format("AdamW: a parameter arena of {} elements cannot be sharded over {} ranks; "
                                              "construct the model with arena_multiple = {}",
                                              arena.numel(), ranks, ranks));
    shard_over_ = shard_over;
    const std::int64_t shard = arena.numel() / ranks;
    shard_begin_ = shard * shard_over->rank();
    shard_end_ = shard_begin_ + shard;
  }
  // Sharded, the step gathers chunk by chunk what the forward reads: each chunk of every
  // rank's shard is broadcast by its owner while the next chunk is updated. Chunk edges lie on
  // multiples of 256 elements from the shard's start (the shards' own alignment is kept).
  const std::int64_t shard = shard_end_ - shard_begin_;
  const Tensor gathered = separate_compute() ? model.padded_compute_weights() : arena;
  const int chunks = sharded() ? kGatherChunks : 1;
  for (int c = 0; c < chunks; ++c) {
    UpdateChunk chunk;
    chunk.begin = c == 0 ? 0 : shard * c / chunks / 256 * 256;
    chunk.end = c + 1 == chunks ? shard : shard * (c + 1) / chunks / 256 * 256;
    if (chunk.end == chunk.begin) continue;
    chunk.segments = segments_within(model.segments(), shard_begin_ + chunk.begin, shard_begin_ + chunk.end);
    for (int r = 0; sharded() && r < shard_over_->size(); ++r)
      chunk.gather.push_back({gathered.rows(r * shard + chunk.begin, r * shard + chunk.end), r});
    chunks_.push_back(std::move(chunk));
  }
  // With a separate compute copy, the masters the forward reads (positional parameters) come
  // from their shards' owners after the chunks.
  if (sharded() && separate_compute()) {
    for (const auto& [begin, end] : model.master_read_ranges())
      for (std::int64_t first = begin; first < end;) {
        const int owner = int(first / shard);
        const std::int64_t last = std::min(end, std::int64_t(owner + 1) * shard);
        master_pieces_.push_back({arena.rows(first, last), owner});
        first = last;
      }
  }
  m_ = allocate_tensor(model.backend(), {shard_end_ - shard_begin_}, arena.dtype);
  v_ = allocate_tensor(model.backend(), {shard_end_ - shard_begin_}, arena.dtype);
  schedule_ = allocate_tensor(model.backend(), {kStepScheduleSize}, DType::f64);
  stats_ = allocate_tensor(model.backend(), {kStepStatsSize}, DType::f64);
}

Tensor AdamW::shard_of(const Tensor& padded_arena) const { return padded_arena.rows(shard_begin_, shard_end_); }

std::array<double, kStepScheduleSize> AdamW::schedule(long step, double lr) const {
  if (step < 1)
    throw std::invalid_argument(fmt::format("AdamW: step is {}, expected >= 1 (1-based for bias correction)", step));
  std::array<double, kStepScheduleSize> values{};
  values[kScheduleLr] = lr;
  values[kScheduleCorrection1] = 1 - std::pow(config_.beta1, double(step));
  values[kScheduleCorrection2] = 1 - std::pow(config_.beta2, double(step));
  return values;
}

// Sharded, the squared norm is the sum over ranks of each shard's sum (the padding adds
// zeros), so every rank clips and guards with the same global norm. Each rank writes the
// compute copy of its shard as it updates it, and the bf16 compute shards are gathered (half
// the bytes of gathering fp32 masters), each chunk while the next is updated; the few masters
// the forward reads in fp32 (positional parameters) are broadcast by their owners. The other
// masters outside this rank's shard are then stale until gather_master_weights()
// (checkpoints). Without a separate compute copy (the CPU backend) the masters themselves are
// gathered the same way. A rank projects the bounded parameters of each chunk before that
// chunk is gathered, so every rank receives the owner's projected values, bit for bit.
void AdamW::step_on_device(Tensor schedule, Tensor stats, Fence* before_gather) {
  Backend& be = model_.backend();
  const Tensor grads = shard_of(model_.padded_gradients());
  const Tensor squares = stats.rows(kStatsGradSquares, kStatsGradSquares + 1);
  be.sum_of_squares_into(squares, grads);
  if (sharded()) shard_over_->all_reduce_sum(squares);
  AdamWHyper hyper;
  hyper.beta1 = config_.beta1;
  hyper.beta2 = config_.beta2;
  hyper.eps = config_.eps;
  hyper.weight_decay = config_.weight_decay;
  hyper.grad_clip = config_.grad_clip;
  const Tensor params = shard_of(model_.padded_parameters());
  const Tensor compute = separate_compute() ? shard_of(model_.padded_compute_weights()) : Tensor{};
  for (const UpdateChunk& chunk : chunks_) {
    const auto part = [&](const Tensor& t) { return t.data == nullptr ? t : t.rows(chunk.begin, chunk.end); };
    be.adamw_guarded(part(params), part(grads), part(m_.tensor), part(v_.tensor), chunk.segments, hyper, schedule,
                     stats, part(compute));
    project_into_bounds(be, chunk.segments, part(params), part(compute));
    if (sharded()) shard_over_->broadcast_async(chunk.gather);
  }
  if (before_gather != nullptr) before_gather->record();
  if (!sharded()) return;
  shard_over_->join();
  shard_over_->broadcast(master_pieces_);  // empty without a separate compute copy
}

void AdamW::gather_master_weights() {
  if (sharded() && separate_compute()) shard_over_->all_gather(model_.padded_parameters());
}

bool AdamW::separate_compute() const { return model_.compute_weights().data != model_.parameters().data; }

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

std::vector<float> AdamW::first_moment_to_host() const { return moment_to_host(m_.tensor); }
std::vector<float> AdamW::second_moment_to_host() const { return moment_to_host(v_.tensor); }

// Sharded: every rank places its shard in a zeroed copy of the padded arena and the copies
// are gathered, so one checkpoint format serves any number of ranks, sharded or not.
std::vector<float> AdamW::moment_to_host(const Tensor& moment) const {
  Backend& be = model_.backend();
  if (!sharded()) return tensor_to_host_f32(be, moment);
  const OwnedTensor whole = allocate_tensor(be, model_.padded_parameters().shape, moment.dtype);
  be.copy(shard_of(whole.tensor), moment);
  shard_over_->all_gather(whole.tensor);
  const std::unique_ptr<Fence> gathered = be.make_fence();
  gathered->record();
  shard_over_->wait(*gathered);  // bounded, unlike the copy's own wait, should a rank have died
  std::vector<float> values = tensor_to_host_f32(be, whole.tensor);
  values.resize(std::size_t(model_.parameters().numel()));  // without the padding
  return values;
}

void AdamW::moments_from_host(std::span<const float> m, std::span<const float> v) {
  const std::size_t numel = std::size_t(model_.parameters().numel());
  if (m.size() != numel || v.size() != numel)
    throw std::invalid_argument(fmt::format("AdamW: moments of {} and {} elements given, expected the arena's {}",
                                            m.size(), v.size(), numel));
  // This rank's shard; the part of it in the padding stays zero.
  const auto shard = [&](std::span<const float> whole) {
    std::vector<float> part(std::size_t(shard_end_ - shard_begin_), 0.0f);
    const std::size_t last = std::min(numel, std::size_t(shard_end_));
    if (std::size_t(shard_begin_) < last)
      std::copy(whole.begin() + shard_begin_, whole.begin() + std::ptrdiff_t(last), part.begin());
    return part;
  };
  tensor_from_host_f32(model_.backend(), m_.tensor, shard(m));
  tensor_from_host_f32(model_.backend(), v_.tensor, shard(v));
}

}  // namespace pope
